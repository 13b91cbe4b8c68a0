package decode

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRenderTable(t *testing.T) {
	tb := &metav1.Table{
		ColumnDefinitions: []metav1.TableColumnDefinition{
			{Name: "Name", Type: "string"}, {Name: "Ready", Type: "string"}, {Name: "Node", Type: "string", Priority: 1}, {Name: "Restarts", Type: "integer"},
		},
		Rows: []metav1.TableRow{
			{Cells: []any{"web-1", "1/1", "node-a", int64(0)}},
			{Cells: []any{"a-much-longer-name", nil, "node-b\twith\ttabs", int64(12)}},
			{Cells: []any{"short", "0/1\nsecond line"}}, // fewer cells than columns
		},
	}
	for _, tc := range []struct {
		name          string
		wide, headers bool
		want          string
	}{
		// As kubectl get prints them (its own table printer): a multi-line
		// cell shows its first line and "...", a tab stays a tab.
		{"default", false, true, "" +
			"NAME                 READY             RESTARTS\n" +
			"web-1                1/1               0\n" +
			"a-much-longer-name                     12\n" +
			"short                0/1...\n"},
		{"wide", true, true, "" +
			"NAME                 READY             NODE               RESTARTS\n" +
			"web-1                1/1               node-a             0\n" +
			"a-much-longer-name                     node-b             with   tabs   12\n" +
			"short                0/1...\n"},
		{"no headers", false, false, "" +
			"web-1                1/1               0\n" +
			"a-much-longer-name                     12\n" +
			"short                0/1...\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := RenderTable(&out, tb, tc.wide, tc.headers); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", out.String(), tc.want)
			}
		})
	}
}

func TestTableDecodesTyped(t *testing.T) {
	for _, in := range []string{
		`{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{},"columnDefinitions":[{"name":"Name","type":"string","format":"name","description":"","priority":0}],"rows":[{"cells":["a"]}]}`,
		"kind: Table\napiVersion: meta.k8s.io/v1beta1\ncolumnDefinitions: [{name: Name, type: string}]\nrows: [{cells: [a]}]\n",
	} {
		d, err := Payload([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		tb, ok := d.Table()
		if !ok || len(tb.Rows) != 1 || tb.Rows[0].Cells[0] != "a" || d.GVK.Group != "meta.k8s.io" {
			t.Errorf("%s: %T %s", in, d.Object, d.GVK)
		}
	}
	d, err := Payload([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := d.Table(); ok {
		t.Error("a ConfigMap is a Table")
	}
}

func TestDetectWatch(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"json event", `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1"}}` + "\n", WatchJSON},
		{"json error event", `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","code":410}}`, WatchJSON},
		{"protobuf frame", "\x00\x00\x00\x10\x0a\x05ADDED\x12\x07k8s\x00...", WatchProtobuf},
		{"an object with a type field", `{"type":"Opaque","object":{}}`, ""},
		{"a Secret", `{"apiVersion":"v1","kind":"Secret","type":"Opaque"}`, ""},
		{"protobuf object", "k8s\x00\x0a\x04\x0a\x02v1", ""},
		{"length beyond the body", "\x00\x01\x00\x00\x0a\x05ADDED", ""},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ct, ok := DetectWatch([]byte(tc.in))
			if ct != tc.want || ok != (tc.want != "") {
				t.Errorf("DetectWatch = %q %v, want %q", ct, ok, tc.want)
			}
		})
	}
}
