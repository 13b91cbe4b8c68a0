package decode

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TableAccept is the Accept header that asks the apiserver for a Table
// (what kubectl get sends). The apiserver serves Tables in JSON and YAML
// only: asked for protobuf as=Table it answers 406 NotAcceptable.
const TableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io"

// Table is the decoded object as a meta.k8s.io Table (v1 or v1beta1), the
// answer to a request with Accept: ...;as=Table;v=v1;g=meta.k8s.io.
func (d *Decoded) Table() (*metav1.Table, bool) {
	t, ok := d.Object.(*metav1.Table)
	return t, ok
}

// RenderTable writes a Table as aligned columns, as kubectl get prints
// it: upper-case headers, then one line per row. Columns with a priority
// above 0 appear only when wide (kubectl's -o wide). A cell is printed
// as the server gave it (the apiserver already formats ages and lists);
// a missing cell is empty. headers false leaves the header line out (the
// Tables of a watch after the first).
func RenderTable(w io.Writer, t *metav1.Table, wide, headers bool) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 8, 3, ' ', 0)
	var visible []int
	for i, c := range t.ColumnDefinitions {
		if wide || c.Priority == 0 {
			visible = append(visible, i)
		}
	}
	if headers {
		names := make([]string, len(visible))
		for j, i := range visible {
			names[j] = strings.ToUpper(t.ColumnDefinitions[i].Name)
		}
		fmt.Fprintln(tw, strings.Join(names, "\t"))
	}
	for _, row := range t.Rows {
		cells := make([]string, len(visible))
		for j, i := range visible {
			if i < len(row.Cells) && row.Cells[i] != nil {
				cells[j] = oneLine(fmt.Sprint(row.Cells[i]))
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Empty trailing cells leave padding behind: drop it.
	for _, line := range bytes.SplitAfter(buf.Bytes(), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if _, err := w.Write(append(bytes.TrimRight(line, " \n"), '\n')); err != nil {
			return err
		}
	}
	return nil
}

// oneLine keeps a cell on its line and its tabs out of the alignment.
func oneLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`, "\t", `\t`).Replace(s)
}
