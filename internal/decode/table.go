package decode

import (
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"
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

// RenderTable writes a Table as kubectl get prints it, with kubectl's own
// table printer (k8s.io/cli-runtime): upper-case headers, then one line
// per row. Columns with a priority above 0 appear only when wide
// (kubectl's -o wide). headers false leaves the header line out (the
// Tables of a watch after the first).
func RenderTable(w io.Writer, t *metav1.Table, wide, headers bool) error {
	return printers.NewTablePrinter(printers.PrintOptions{Wide: wide, NoHeaders: !headers}).PrintObj(t, w)
}
