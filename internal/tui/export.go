package tui

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// harHost stands for the apiserver in exported URLs: a record holds the
// request's path, not the address the client dialled.
const harHost = "https://kube-apiserver"

// writeJSONL writes records as a capture file (one record per line), so
// an export opens again with `kproxy tui FILE`.
func writeJSONL(w io.Writer, recs []*record.Record) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// HAR 1.2 (http://www.softwareishard.com/blog/har-12-spec/), the shape
// browsers' devtools, mitmproxy and Charles exchange.
type har struct {
	Log harLog `json:"log"`
}

type harLog struct {
	Version string     `json:"version"`
	Creator harCreator `json:"creator"`
	Entries []harEntry `json:"entries"`
}

type harCreator struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

type harEntry struct {
	StartedDateTime string      `json:"startedDateTime"`
	Time            float64     `json:"time"`
	Request         harRequest  `json:"request"`
	Response        harResponse `json:"response"`
	Cache           struct{}    `json:"cache"`
	Timings         harTimings  `json:"timings"`
	Connection      string      `json:"connection,omitempty"`
	Comment         string      `json:"comment,omitempty"`
	// Kproxy carries the record itself: the prediction, the stages and the
	// trace, which HAR has no fields for (custom fields start with "_").
	Kproxy *record.Record `json:"_kproxy"`
}

type harNV struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type harRequest struct {
	Method      string   `json:"method"`
	URL         string   `json:"url"`
	HTTPVersion string   `json:"httpVersion"`
	Cookies     []harNV  `json:"cookies"`
	Headers     []harNV  `json:"headers"`
	QueryString []harNV  `json:"queryString"`
	PostData    *harPost `json:"postData,omitempty"`
	HeadersSize int      `json:"headersSize"`
	BodySize    int64    `json:"bodySize"`
}

type harPost struct {
	MimeType string `json:"mimeType"`
	Text     string `json:"text"`
	Comment  string `json:"comment,omitempty"`
}

type harResponse struct {
	Status      int        `json:"status"`
	StatusText  string     `json:"statusText"`
	HTTPVersion string     `json:"httpVersion"`
	Cookies     []harNV    `json:"cookies"`
	Headers     []harNV    `json:"headers"`
	Content     harContent `json:"content"`
	RedirectURL string     `json:"redirectURL"`
	HeadersSize int        `json:"headersSize"`
	BodySize    int64      `json:"bodySize"`
}

type harContent struct {
	Size     int64  `json:"size"`
	MimeType string `json:"mimeType"`
	Text     string `json:"text,omitempty"`
	Comment  string `json:"comment,omitempty"`
}

type harTimings struct {
	Send    float64 `json:"send"`
	Wait    float64 `json:"wait"`
	Receive float64 `json:"receive"`
}

func nvs(h map[string][]string) []harNV {
	out := []harNV{}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			out = append(out, harNV{k, v})
		}
	}
	return out
}

func ms(ns int64) float64 { return float64(ns) / float64(time.Millisecond) }

// harOf turns records into a HAR log. Bodies are not recorded, so a
// request's postData says so, and a response's content is its Status
// (reason and message) when the apiserver sent one.
func harOf(recs []*record.Record, version string) har {
	h := har{Log: harLog{Version: "1.2", Creator: harCreator{"kproxy", version}, Entries: []harEntry{}}}
	for _, r := range recs {
		u := harHost + r.Request.Path
		if r.Request.Query != "" {
			u += "?" + r.Request.Query
		}
		query := []harNV{}
		if vals, err := url.ParseQuery(r.Request.Query); err == nil {
			query = nvs(vals)
		}
		proto := r.Request.Protocol // the client's, both ways
		if proto == "" {
			proto = "HTTP/1.1" // a record from before kproxy kept it
		}
		e := harEntry{
			StartedDateTime: r.Start.UTC().Format(time.RFC3339Nano),
			Time:            ms(r.Latency.TotalNs),
			Request: harRequest{
				Method: r.Request.Method, URL: u, HTTPVersion: proto,
				Cookies: []harNV{}, Headers: nvs(r.Request.Headers), QueryString: query,
				HeadersSize: -1, BodySize: r.Request.BodyBytes,
			},
			Response: harResponse{
				Status: r.Actual.Status, StatusText: http.StatusText(r.Actual.Status), HTTPVersion: proto,
				Cookies: []harNV{}, Headers: nvs(r.Actual.Headers), HeadersSize: -1, BodySize: r.Actual.ResponseBytes,
				Content: harContent{Size: r.Actual.ResponseBytes, MimeType: firstHeader(r.Actual.Headers, "Content-Type")},
			},
			Timings: harTimings{Send: 0, Wait: ms(r.Latency.UpstreamNs), Receive: max(ms(r.Latency.TotalNs-r.Latency.UpstreamNs), 0)},
			Comment: fmt.Sprintf("kproxy predicted %s", predictedText(r)),
			Kproxy:  r,
		}
		switch {
		case len(r.Request.Body) > 0:
			e.Request.PostData = &harPost{MimeType: "application/json", Text: string(r.Request.Body),
				Comment: "the body as JSON (kproxy serve --capture-bodies), secrets redacted"}
		case r.Request.BodyBytes > 0:
			e.Request.PostData = &harPost{MimeType: r.Request.ContentType, Text: "", Comment: "not recorded: kproxy serve --capture-bodies records write bodies"}
		}
		if r.Actual.Reason != "" || r.Actual.Message != "" {
			st, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
				"code": r.Actual.Status, "reason": r.Actual.Reason, "message": r.Actual.Message})
			e.Response.Content.Text = string(st)
			e.Response.Content.Comment = "the Status kproxy read from the apiserver's answer (reason and message)"
		}
		h.Log.Entries = append(h.Log.Entries, e)
	}
	return h
}

func firstHeader(h map[string][]string, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func predictedText(r *record.Record) string {
	p := r.Predicted
	switch {
	case p.Stage == record.StageUnknown:
		return "unknown: " + p.Message
	case p.Stage != "":
		return fmt.Sprintf("%d %s at %s", p.Status, p.Reason, p.Stage)
	}
	return fmt.Sprint(p.Status)
}

// exportFile writes the selection to path in format (har or jsonl),
// through a temporary file so a failed export leaves nothing half-written.
func exportFile(format, path string, recs []*record.Record, version string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".kproxy-export-*")
	if err != nil {
		return fmt.Errorf("export to %s: %w (check the directory exists and is writable)", path, err)
	}
	defer os.Remove(tmp.Name())
	switch format {
	case "jsonl":
		err = writeJSONL(tmp, recs)
	case "har":
		enc := json.NewEncoder(tmp)
		enc.SetIndent("", "  ")
		err = enc.Encode(harOf(recs, version))
	default:
		err = fmt.Errorf("export format %q: use har or jsonl", format)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("export to %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("export to %s: %w", path, err)
	}
	return nil
}
