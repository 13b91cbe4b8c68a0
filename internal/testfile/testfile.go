// Package testfile is kproxy's CI test format (apiVersion
// kproxy.dev/v1alpha1, kind Test): requests, the identities that send
// them, and the answers they must get. Load decodes strictly and names
// the file, line and field of every mistake; the format is documented in
// docs/testing.md.
package testfile

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kproxy/kproxy/internal/record"
)

// APIVersion and Kind identify a test file.
const (
	APIVersion = "kproxy.dev/v1alpha1"
	Kind       = "Test"
)

// File is one test file.
type File struct {
	APIVersion string   `yaml:"apiVersion" json:"apiVersion"`
	Kind       string   `yaml:"kind" json:"kind"`
	Metadata   Metadata `yaml:"metadata,omitempty" json:"metadata,omitempty"`
	// Snapshot is the snapshot directory the local engine replays over,
	// relative to the file (--snapshot overrides it).
	Snapshot string `yaml:"snapshot,omitempty" json:"snapshot,omitempty"`
	// Overlays are directories of objects applied to the snapshot for
	// every case of this file, relative to the file.
	Overlays []string `yaml:"overlays,omitempty" json:"overlays,omitempty"`
	Cases    []Case   `yaml:"cases" json:"cases"`

	// Path is where the file was read from.
	Path string `yaml:"-" json:"-"`
}

// Metadata names a suite.
type Metadata struct {
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
}

// Case is one request and what it must get.
type Case struct {
	Name string `yaml:"name" json:"name"`

	// The identity: user (with groups, uid, extra) as authentication
	// would find it; or a credential (token, tokenFile, or
	// clientCertificate and clientKey); or anonymous. Impersonate adds
	// Impersonate-* headers to any of them.
	User              string              `yaml:"user,omitempty" json:"user,omitempty"`
	Groups            []string            `yaml:"groups,omitempty" json:"groups,omitempty"`
	UID               string              `yaml:"uid,omitempty" json:"uid,omitempty"`
	Extra             map[string][]string `yaml:"extra,omitempty" json:"extra,omitempty"`
	Anonymous         bool                `yaml:"anonymous,omitempty" json:"anonymous,omitempty"`
	Token             string              `yaml:"token,omitempty" json:"token,omitempty"`
	TokenFile         string              `yaml:"tokenFile,omitempty" json:"tokenFile,omitempty"`
	ClientCertificate string              `yaml:"clientCertificate,omitempty" json:"clientCertificate,omitempty"`
	ClientKey         string              `yaml:"clientKey,omitempty" json:"clientKey,omitempty"`
	Impersonate       *Identity           `yaml:"impersonate,omitempty" json:"impersonate,omitempty"`

	Request Request `yaml:"request" json:"request"`
	Expect  Expect  `yaml:"expect" json:"expect"`

	// Note is free text (generate says here what it could not keep).
	Note string `yaml:"note,omitempty" json:"note,omitempty"`

	// Line is the case's line in its file; Dir the file's directory
	// (bodyFile, tokenFile and certificates are relative to it).
	Line int    `yaml:"-" json:"-"`
	File string `yaml:"-" json:"-"`
	Dir  string `yaml:"-" json:"-"`
}

// Identity is an impersonated identity.
type Identity struct {
	User   string              `yaml:"user,omitempty" json:"user,omitempty"`
	Groups []string            `yaml:"groups,omitempty" json:"groups,omitempty"`
	UID    string              `yaml:"uid,omitempty" json:"uid,omitempty"`
	Extra  map[string][]string `yaml:"extra,omitempty" json:"extra,omitempty"`
}

// Request is what is sent.
type Request struct {
	Method string `yaml:"method,omitempty" json:"method,omitempty"`
	// Path with its query, e.g. /api/v1/namespaces/default/pods?limit=1.
	Path string `yaml:"path" json:"path"`
	// Body is inline: a YAML mapping (sent as JSON) or a string (sent as
	// is). BodyFile reads it from a file instead.
	Body        any               `yaml:"body,omitempty" json:"body,omitempty"`
	BodyFile    string            `yaml:"bodyFile,omitempty" json:"bodyFile,omitempty"`
	ContentType string            `yaml:"contentType,omitempty" json:"contentType,omitempty"`
	Headers     map[string]string `yaml:"headers,omitempty" json:"headers,omitempty"`
}

// Expect is what the answer must be; what is left out is not compared.
type Expect struct {
	Status int `yaml:"status,omitempty" json:"status,omitempty"`
	// Stage is the deciding stage (the contract's names); "none" when
	// the request passes every stage (it succeeds).
	Stage  string `yaml:"stage,omitempty" json:"stage,omitempty"`
	Reason string `yaml:"reason,omitempty" json:"reason,omitempty"`
	// Message and Warnings are regular expressions; every warning
	// expression must match one of the answer's warnings.
	Message  string   `yaml:"message,omitempty" json:"message,omitempty"`
	Warnings []string `yaml:"warnings,omitempty" json:"warnings,omitempty"`
}

// StageNone is expect.stage for a request no stage refuses.
const StageNone = "none"

// Error is a mistake in a test file, at a line, in a field.
type Error struct {
	File  string
	Line  int
	Field string // e.g. cases[2].expect.stage
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// Load reads test files: each argument is a file or a directory (its
// *.yaml and *.yml files, recursively, that are kind Test). Every error
// names its file and line; all of them are returned, joined.
func Load(paths ...string) ([]*File, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("test file %s: %w", p, err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		found := 0
		err = filepath.WalkDir(p, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml") {
				return nil
			}
			if ok, err := isTestFile(path); err != nil || !ok {
				return err
			}
			files = append(files, path)
			found++
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("test directory %s: %w", p, err)
		}
		if found == 0 {
			return nil, fmt.Errorf("test directory %s has no test files (YAML with apiVersion: %s and kind: %s)", p, APIVersion, Kind)
		}
	}
	var out []*File
	var errs []error
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("test file %s: %w", f, err))
			continue
		}
		tf, err := Parse(f, b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, tf)
	}
	return out, errors.Join(errs...)
}

// isTestFile reports whether a YAML file in a directory declares kind
// Test (directories also hold snapshots, overlays and bodies).
func isTestFile(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var head struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
	}
	if err := yaml.Unmarshal(b, &head); err != nil {
		return false, nil //nolint:nilerr // not YAML: not a test file, so the walk skips it
	}
	return head.Kind == Kind && strings.HasPrefix(head.APIVersion, "kproxy.dev/"), nil
}

// Parse decodes one test file strictly: unknown fields, wrong types,
// missing required fields and values outside the contract are errors
// naming the line and field.
func Parse(name string, b []byte) (*File, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil {
		return nil, yamlError(name, err)
	}
	if len(root.Content) == 0 {
		return nil, &Error{File: name, Msg: "empty file; want apiVersion: " + APIVersion + ", kind: " + Kind + " and cases"}
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, yamlErrorIn(name, err, &root)
	}
	f.Path = name
	dir := filepath.Dir(name)
	doc := root.Content[0]
	var errs []error
	add := func(line int, field, format string, a ...any) {
		errs = append(errs, &Error{File: name, Line: line, Field: field, Msg: fmt.Sprintf(format, a...)})
	}
	if f.APIVersion != APIVersion {
		add(lineOf(doc, "apiVersion"), "apiVersion", "%q is not a version kproxy reads; want %s", f.APIVersion, APIVersion)
	}
	if f.Kind != Kind {
		add(lineOf(doc, "kind"), "kind", "%q: want %s", f.Kind, Kind)
	}
	if len(f.Cases) == 0 {
		add(lineOf(doc, "cases"), "cases", "no cases; a test file needs at least one")
	}
	casesNode := child(doc, "cases")
	names := map[string]int{}
	for i := range f.Cases {
		c := &f.Cases[i]
		c.Dir, c.File = dir, name
		var cn *yaml.Node
		if casesNode != nil && i < len(casesNode.Content) {
			cn = casesNode.Content[i]
			c.Line = cn.Line
		}
		field := func(path ...string) string { return fmt.Sprintf("cases[%d].%s", i, strings.Join(path, ".")) }
		line := func(path ...string) int {
			n := cn
			for _, p := range path {
				if next := child(n, p); next != nil {
					n = next
				} else {
					break
				}
			}
			if n == nil {
				return c.Line
			}
			return n.Line
		}
		if c.Name == "" {
			add(c.Line, field("name"), "missing; every case needs a name (it is the JUnit test case's name)")
		} else if prev, dup := names[c.Name]; dup {
			add(line("name"), field("name"), "%q is also the name of the case on line %d; names must be unique", c.Name, prev)
		} else {
			names[c.Name] = c.Line
		}
		validateIdentity(c, add, field, line)
		validateRequest(c, add, field, line)
		validateExpect(c, add, field, line)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &f, nil
}

type addFunc func(line int, field, format string, a ...any)

func validateIdentity(c *Case, add addFunc, field func(...string) string, line func(...string) int) {
	kinds := []string{}
	if c.User != "" {
		kinds = append(kinds, "user")
	}
	if c.Anonymous {
		kinds = append(kinds, "anonymous")
	}
	if c.Token != "" || c.TokenFile != "" {
		kinds = append(kinds, "token")
	}
	if c.ClientCertificate != "" {
		kinds = append(kinds, "clientCertificate")
	}
	if len(kinds) > 1 {
		add(c.Line, field("user"), "the case gives %s: give one identity (user, a token, a client certificate, or anonymous)", strings.Join(kinds, " and "))
	}
	if c.Token != "" && c.TokenFile != "" {
		add(line("token"), field("token"), "give token or tokenFile, not both")
	}
	if c.User == "" && (len(c.Groups) > 0 || c.UID != "" || len(c.Extra) > 0) {
		add(line("groups"), field("groups"), "groups, uid and extra belong to a user: add user")
	}
	if (c.ClientCertificate == "") != (c.ClientKey == "") {
		add(line("clientCertificate"), field("clientCertificate"), "give clientCertificate and clientKey together")
	}
	if c.Impersonate != nil && c.Impersonate.User == "" {
		add(line("impersonate"), field("impersonate", "user"), "missing: Impersonate-Group and Impersonate-Uid need Impersonate-User (the apiserver answers 400 without it; send that as request.headers if it is what you test)")
	}
}

var methods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// Methods are the methods a case may send, for a generator to check a
// recorded request against.
func Methods() []string { return slices.Clone(methods) }

func validateRequest(c *Case, add addFunc, field func(...string) string, line func(...string) int) {
	r := &c.Request
	if r.Method == "" {
		r.Method = http.MethodGet
		if r.Body != nil || r.BodyFile != "" {
			add(line("request"), field("request", "method"), "missing: a request with a body needs a method (POST, PUT or PATCH)")
		}
	}
	r.Method = strings.ToUpper(r.Method)
	if !slices.Contains(methods, r.Method) {
		add(line("request", "method"), field("request", "method"), "%q: want one of %s", r.Method, strings.Join(methods, ", "))
	}
	if r.Path == "" {
		add(line("request"), field("request", "path"), "missing: the request path, e.g. /api/v1/namespaces/default/pods")
	} else if u, err := url.ParseRequestURI(r.Path); err != nil || !strings.HasPrefix(r.Path, "/") || u.Host != "" {
		add(line("request", "path"), field("request", "path"), "%q is not a request path: want one starting with /, e.g. /api/v1/namespaces/default/pods?limit=1", r.Path)
	}
	if r.Body != nil && r.BodyFile != "" {
		add(line("request", "bodyFile"), field("request", "bodyFile"), "give body or bodyFile, not both")
	}
	switch r.Body.(type) {
	case nil, string, map[string]any, []any:
	default:
		add(line("request", "body"), field("request", "body"), "want a YAML mapping (sent as JSON) or a string (sent as is)")
	}
}

func validateExpect(c *Case, add addFunc, field func(...string) string, line func(...string) int) {
	e := &c.Expect
	if e.Status == 0 && e.Stage == "" && e.Reason == "" && e.Message == "" && len(e.Warnings) == 0 {
		add(line("expect"), field("expect"), "nothing to compare: give at least one of status, stage, reason, message, warnings")
	}
	if e.Status != 0 && (e.Status < 100 || e.Status > 599) {
		add(line("expect", "status"), field("expect", "status"), "%d is not an HTTP status", e.Status)
	}
	if e.Stage != "" && e.Stage != StageNone && !slices.Contains(record.StageOrder[:], e.Stage) {
		add(line("expect", "stage"), field("expect", "stage"), "%q is not a stage; want one of %s, or %s for a request no stage refuses", e.Stage, strings.Join(record.StageOrder[:], ", "), StageNone)
	}
	if e.Message != "" {
		if _, err := regexp.Compile(e.Message); err != nil {
			add(line("expect", "message"), field("expect", "message"), "not a regular expression: %v", err)
		}
	}
	for i, w := range e.Warnings {
		if _, err := regexp.Compile(w); err != nil {
			add(line("expect", "warnings"), fmt.Sprintf("%s[%d]", field("expect", "warnings"), i), "not a regular expression: %v", err)
		}
	}
}

// BodyBytes is the request body and its content type: an inline mapping
// as JSON, a string as is, a file's bytes (YAML files as YAML).
func (c *Case) BodyBytes() ([]byte, string, error) {
	r := c.Request
	ct := r.ContentType
	switch b := r.Body.(type) {
	case nil:
	case string:
		if ct == "" {
			ct = "application/json"
		}
		return []byte(b), ct, nil
	default:
		j, err := sigsyaml.Marshal(b)
		if err == nil {
			j, err = sigsyaml.YAMLToJSON(j)
		}
		if err != nil {
			return nil, "", fmt.Errorf("case %q: request.body: %w", c.Name, err)
		}
		if ct == "" {
			ct = "application/json"
		}
		return j, ct, nil
	}
	if r.BodyFile == "" {
		return nil, ct, nil
	}
	p := c.Resolve(r.BodyFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, "", fmt.Errorf("case %q: request.bodyFile: %w", c.Name, err)
	}
	if ct == "" {
		ct = "application/json"
		if strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml") {
			ct = "application/yaml"
		}
	}
	return b, ct, nil
}

// Resolve makes a path in the case relative to its file's directory.
func (c *Case) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) || c.Dir == "" {
		return p
	}
	return filepath.Join(c.Dir, p)
}

// TokenValue is the case's bearer token (from token or tokenFile).
func (c *Case) TokenValue() (string, error) {
	if c.TokenFile == "" {
		return c.Token, nil
	}
	b, err := os.ReadFile(c.Resolve(c.TokenFile))
	if err != nil {
		return "", fmt.Errorf("case %q: tokenFile: %w", c.Name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// IdentityKind names how the case identifies itself.
func (c *Case) IdentityKind() string {
	switch {
	case c.User != "":
		return "user"
	case c.Token != "" || c.TokenFile != "":
		return "token"
	case c.ClientCertificate != "":
		return "clientCertificate"
	case c.Anonymous:
		return "anonymous"
	}
	return "default"
}

// Marshal writes a test file as YAML (generate).
func Marshal(f *File) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, err
	}
	return buf.Bytes(), enc.Close()
}

// child is the value of key in a mapping node.
func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil {
		return nil
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func lineOf(n *yaml.Node, key string) int {
	if c := child(n, key); c != nil {
		return c.Line
	}
	return n.Line
}

// yamlError turns the decoder's errors ("line 7: field foo not found in
// type testfile.Case") into errors naming the file and the fix.
func yamlError(name string, err error) error { return yamlErrorIn(name, err, nil) }

// yamlErrorIn is yamlError for a file whose YAML tree is root: a value of
// the wrong type is named by its field (yaml.v3 says only the line).
func yamlErrorIn(name string, err error, root *yaml.Node) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var errs []error
		for _, m := range te.Errors {
			errs = append(errs, decodeError(name, m, root))
		}
		return errors.Join(errs...)
	}
	return decodeError(name, err.Error(), root)
}

var (
	lineRe      = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)
	wrongTypeRe = regexp.MustCompile("^cannot unmarshal !!(\\w+) (?:(`.*`) )?into (.+)$")
)

func decodeError(name, msg string, root *yaml.Node) error {
	m := lineRe.FindStringSubmatch(msg)
	if m == nil {
		return &Error{File: name, Msg: msg}
	}
	line, _ := strconv.Atoi(m[1])
	text := m[2]
	if f, ok := strings.CutPrefix(text, "field "); ok {
		if fieldName, typ, ok := strings.Cut(f, " not found in type "); ok {
			text = fmt.Sprintf("unknown field %q in %s; known fields: %s", fieldName, typeName(typ), strings.Join(knownFields(typ), ", "))
		}
	}
	e := &Error{File: name, Line: line, Msg: text}
	if w := wrongTypeRe.FindStringSubmatch(text); w != nil {
		got := yamlKind(w[1])
		if w[2] != "" {
			got += " " + w[2]
		}
		e.Msg = fmt.Sprintf("want %s, got %s", goKind(w[3]), got)
		if root != nil {
			kind := yaml.ScalarNode
			switch w[1] {
			case "map":
				kind = yaml.MappingNode
			case "seq":
				kind = yaml.SequenceNode
			}
			e.Field = fieldAt(root, line, kind, "")
		}
	}
	return e
}

// yamlKind names a YAML tag as people say it.
func yamlKind(tag string) string {
	switch tag {
	case "str":
		return "a string"
	case "int", "float":
		return "a number"
	case "bool":
		return "a boolean"
	case "seq":
		return "a list"
	case "map":
		return "a mapping"
	case "null":
		return "null"
	}
	return "!!" + tag
}

// goKind names the Go type a value decodes into as people say it.
func goKind(t string) string {
	switch {
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "int"), strings.HasPrefix(t, "uint"), strings.HasPrefix(t, "float"):
		return "a number"
	case t == "bool":
		return "true or false"
	case t == "[]string":
		return "a list of strings"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "a mapping"
	}
	return "a " + typeName(t)
}

// fieldAt is the path (cases[0].expect.status) of the value of kind on
// line in the YAML tree n, "" if none.
func fieldAt(n *yaml.Node, line int, kind yaml.Kind, path string) string {
	var keys []string
	var values []*yaml.Node
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			keys, values = append(keys, path), append(values, c)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := n.Content[i].Value
			if path != "" {
				p = path + "." + p
			}
			keys, values = append(keys, p), append(values, n.Content[i+1])
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			keys, values = append(keys, fmt.Sprintf("%s[%d]", path, i)), append(values, c)
		}
	}
	// The deepest value on the line: a block mapping starts on the line
	// of its first key.
	for i, v := range values {
		if p := fieldAt(v, line, kind, keys[i]); p != "" {
			return p
		}
		if v.Line == line && v.Kind == kind && n.Kind != yaml.DocumentNode {
			return keys[i]
		}
	}
	return ""
}

func typeName(t string) string {
	switch strings.TrimPrefix(t, "testfile.") {
	case "File":
		return "the test file"
	case "Case":
		return "a case"
	case "Request":
		return "request"
	case "Expect":
		return "expect"
	case "Identity":
		return "impersonate"
	case "Metadata":
		return "metadata"
	}
	return t
}

var fieldsOf = map[string][]string{
	"File":     {"apiVersion", "kind", "metadata", "snapshot", "overlays", "cases"},
	"Case":     {"name", "user", "groups", "uid", "extra", "anonymous", "token", "tokenFile", "clientCertificate", "clientKey", "impersonate", "request", "expect", "note"},
	"Request":  {"method", "path", "body", "bodyFile", "contentType", "headers"},
	"Expect":   {"status", "stage", "reason", "message", "warnings"},
	"Identity": {"user", "groups", "uid", "extra"},
	"Metadata": {"name"},
}

func knownFields(t string) []string {
	f := slices.Clone(fieldsOf[strings.TrimPrefix(t, "testfile.")])
	sort.Strings(f)
	return f
}
