package decode

import (
	"bytes"
	"strings"
	"testing"
)

// tableSeeds are the golden Tables the apiserver answered (JSON and
// YAML) and hand-made ones with the cells a printer can trip on.
func tableSeeds(f *testing.F) [][]byte {
	f.Helper()
	var seeds [][]byte
	for _, b := range testdataFiles(f, "decode/responses", ".json", ".yaml") {
		if bytes.Contains(b, []byte("Table")) {
			seeds = append(seeds, b)
		}
	}
	const cols = `"columnDefinitions":[{"name":"Name","type":"string","format":"name"},{"name":"Age","type":"date"},{"name":"N","type":"integer","priority":1},` +
		`{"name":"F","type":"number"},{"name":"B","type":"boolean","priority":2}]`
	for _, rows := range []string{
		`[]`, `null`, `[{"cells":[]}]`, `[{"cells":null}]`, `[{"cells":["a"]}]`,
		`[{"cells":["a","2026-11-29T20:58:57Z",1,1.5,true,"extra"]}]`,
		`[{"cells":["a\nb\fc\rd\ve\tf","not a date","x",{"a":[1]},null]}]`,
		`[{"cells":["a",-1e308,9223372036854775807,"NaN",false]},{"cells":["b"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"b"}}}]`,
		`[{"cells":["` + strings.Repeat("w", 300) + `","","","",""],"conditions":[{"type":"Completed","status":"True"}]}]`,
	} {
		seeds = append(seeds, []byte(`{"kind":"Table","apiVersion":"meta.k8s.io/v1",`+cols+`,"rows":`+rows+`}`))
		seeds = append(seeds, []byte(`{"kind":"Table","apiVersion":"meta.k8s.io/v1beta1","columnDefinitions":[],"rows":`+rows+`}`))
	}
	return seeds
}

// FuzzTable decodes arbitrary bytes as a Table response and renders it
// as kubectl get prints it. It checks that rendering never panics; that
// it prints one line per row, plus the header line when asked (a cell's
// line breaks never add lines); and that the Table renders the same after
// a round trip through its JSON.
func FuzzTable(f *testing.F) {
	for _, s := range tableSeeds(f) {
		f.Add(s, false, true)
		f.Add(s, true, true)
	}
	f.Add([]byte("kind: Table\napiVersion: meta.k8s.io/v1\ncolumnDefinitions: [{name: A, type: string}]\nrows: [{cells: [x]}]\n"), false, false)
	f.Fuzz(func(t *testing.T, body []byte, wide, headers bool) {
		d, err := Payload(body)
		if err != nil {
			return
		}
		tb, ok := d.Table()
		if !ok {
			return
		}
		var out bytes.Buffer
		err = RenderTable(&out, tb, wide, headers)
		if err != nil {
			return
		}
		want := len(tb.Rows)
		if headers && (want > 0 || out.Len() > 0) {
			want++
		}
		if got := strings.Count(out.String(), "\n"); got != want {
			t.Fatalf("a Table of %d rows renders (wide %v, headers %v) as %d lines:\n%s", len(tb.Rows), wide, headers, got, out.String())
		}
		j, err := d.JSON()
		if err != nil {
			return // a row's raw object is not JSON
		}
		d2, err := Payload(j)
		if err != nil {
			t.Fatalf("the Table's JSON does not decode: %v\n%s", err, j)
		}
		tb2, ok := d2.Table()
		if !ok {
			t.Fatalf("the Table's JSON decodes to %s", d2.GVK)
		}
		var out2 bytes.Buffer
		if err := RenderTable(&out2, tb2, wide, headers); err != nil || out2.String() != out.String() {
			t.Fatalf("the Table renders as\n%s\nand after a round trip through JSON as (%v)\n%s", out.String(), err, out2.String())
		}
	})
}
