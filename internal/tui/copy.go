package tui

import (
	"strings"

	"github.com/kproxy/kproxy/internal/record"
)

// The `c` action: the focused request as commands a person can run again.
// Credentials are placeholders ($TOKEN, $CERT, $KEY, $APISERVER), never the
// caller's: records hold none, and a command on a screen or clipboard must
// not either.

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func requestURI(r *record.Record) string {
	u := r.Request.Path
	if r.Request.Query != "" {
		u += "?" + r.Request.Query
	}
	return u
}

// credentialArgs are the placeholders for how the caller authenticated.
func credentialArgs(r *record.Record, curl bool) []string {
	switch r.Identity {
	case "certificate":
		if curl {
			return []string{"--cert", `"$CERT"`, "--key", `"$KEY"`}
		}
		return []string{"--client-certificate", `"$CERT"`, "--client-key", `"$KEY"`}
	case "anonymous":
		return nil
	}
	if curl {
		return []string{"-H", `"Authorization: Bearer $TOKEN"`}
	}
	return []string{"--token", `"$TOKEN"`}
}

// curlCommand is the request as curl sends it. A write's body is not
// recorded, so the command reads it from a file the user supplies.
func curlCommand(r *record.Record) string {
	args := []string{"curl", "--cacert", `"$CA"`}
	args = append(args, credentialArgs(r, true)...)
	if r.Request.Method != "GET" {
		args = append(args, "-X", r.Request.Method)
	}
	if h := firstHeader(r.Request.Headers, "Accept"); h != "" {
		args = append(args, "-H", shellQuote("Accept: "+h))
	}
	if r.Request.BodyBytes > 0 {
		ct := r.Request.ContentType
		if ct == "" {
			ct = "application/json"
		}
		args = append(args, "-H", shellQuote("Content-Type: "+ct), "--data-binary", "@body.json")
	}
	for _, h := range nvs(r.Request.Headers) {
		if strings.HasPrefix(h.Name, "Impersonate-") {
			args = append(args, "-H", shellQuote(h.Name+": "+h.Value))
		}
	}
	args = append(args, `"$APISERVER"`+shellQuote(requestURI(r)))
	return strings.Join(args, " ")
}

// kubectlCommand is the same request through kubectl's --raw forms, which
// send exactly this path and query; "" when kubectl has no form for the
// method.
func kubectlCommand(r *record.Record) string {
	var verb string
	switch r.Request.Method {
	case "GET":
		verb = "get"
	case "POST":
		verb = "create"
	case "PUT":
		verb = "replace"
	case "DELETE":
		verb = "delete"
	default:
		return ""
	}
	args := []string{"kubectl", "--server", `"$APISERVER"`, "--certificate-authority", `"$CA"`}
	args = append(args, credentialArgs(r, false)...)
	if r.Request.ActingAs != "" {
		args = append(args, "--as", shellQuote(r.Request.ActingAs))
	}
	extra := false
	for _, h := range nvs(r.Request.Headers) {
		switch {
		case h.Name == "Impersonate-Group":
			args = append(args, "--as-group", shellQuote(h.Value))
		case h.Name == "Impersonate-Uid":
			args = append(args, "--as-uid", shellQuote(h.Value))
		case strings.HasPrefix(h.Name, "Impersonate-Extra-"):
			extra = true
		}
	}
	args = append(args, verb, "--raw", shellQuote(requestURI(r)))
	if verb == "create" || verb == "replace" {
		args = append(args, "-f", "body.json")
	}
	cmd := strings.Join(args, " ")
	if extra {
		// kubectl has no flag for them: only the curl line sends them.
		cmd += "\n# kubectl cannot send Impersonate-Extra-* headers: the curl line above does"
	}
	return cmd
}

// copyText is what `c` shows and puts on the clipboard.
func copyText(r *record.Record) string {
	var b strings.Builder
	b.WriteString(curlCommand(r))
	if k := kubectlCommand(r); k != "" {
		b.WriteString("\n" + k)
	}
	switch {
	case len(r.Request.Body) > 0:
		b.WriteString("\n# body.json: the recorded body (the Request tab; secrets redacted):\n#   kproxy flows FILE --filter ... -o jsonpath='{.items[0].request.body}' > body.json")
	case r.Request.BodyBytes > 0:
		b.WriteString("\n# body.json: the request body (not recorded: kproxy serve --capture-bodies records write bodies)")
	}
	return b.String()
}
