package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
)

// kproxy prints the way kubectl does, with kubectl's own printers
// (k8s.io/cli-runtime): -o json, yaml, jsonpath=..., go-template=..., and
// tables with kubectl's column layout.

// outputAPIVersion is the apiVersion of the documents kproxy prints.
const outputAPIVersion = "kproxy.dev/v1alpha1"

// outputFlags is -o for a command with a view of its own (human, e.g.
// "table"), next to kubectl's structured formats; def is the default.
type outputFlags struct {
	human string
	print *genericclioptions.PrintFlags
}

func newOutputFlags(human, def string) *outputFlags {
	pf := genericclioptions.NewPrintFlags("")
	pf.OutputFormat = &def
	return &outputFlags{human: human, print: pf}
}

func (o *outputFlags) addFlags(fs *pflag.FlagSet, extra ...string) {
	formats := append([]string{o.human}, extra...)
	formats = append(formats, "json", "yaml", "jsonpath=...", "go-template=...")
	fs.StringVarP(o.print.OutputFormat, "output", "o", *o.print.OutputFormat, "output format: "+strings.Join(formats, ", "))
	if t := o.print.TemplatePrinterFlags; t != nil && t.TemplateArgument != nil {
		fs.StringVar(t.TemplateArgument, "template", *t.TemplateArgument, "the template for -o go-template or jsonpath, as kubectl --template")
	}
}

// isHuman reports the command's own view (or one of its other names).
func (o *outputFlags) isHuman(also ...string) bool {
	f := *o.print.OutputFormat
	if f == o.human {
		return true
	}
	for _, a := range also {
		if f == a {
			return true
		}
	}
	return false
}

// validate says, before any work, whether -o names a format. "name"
// (kubectl's KIND/NAME) is one only where the command lists it: kproxy's
// own documents have no name.
func (o *outputFlags) validate(also ...string) error {
	if o.isHuman(also...) {
		return nil
	}
	if _, err := o.print.ToPrinter(); err != nil || *o.print.OutputFormat == "name" {
		return fmt.Errorf("-o %q: use %s", *o.print.OutputFormat, strings.Join(append([]string{o.human}, append(also, "json", "yaml", "jsonpath=...", "go-template=...")...), ", "))
	}
	return nil
}

// printDocument prints doc (any JSON-encodable value) as a kind of
// kproxy.dev/v1alpha1 document in the structured -o format.
func (o *outputFlags) printDocument(w io.Writer, kind string, doc any) error {
	p, err := o.print.ToPrinter()
	if err != nil {
		return err
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal(b, &u.Object); err != nil {
		return err
	}
	u.SetAPIVersion(outputAPIVersion)
	u.SetKind(kind)
	return p.PrintObj(u, w)
}

// printTable prints rows under columns as kubectl get prints a table.
func printTable(w io.Writer, columns []string, rows [][]any) error {
	t := &metav1.Table{}
	for _, c := range columns {
		t.ColumnDefinitions = append(t.ColumnDefinitions, metav1.TableColumnDefinition{Name: c, Type: "string"})
	}
	for _, r := range rows {
		t.Rows = append(t.Rows, metav1.TableRow{Cells: r})
	}
	return printers.NewTablePrinter(printers.PrintOptions{}).PrintObj(t, w)
}
