package stages

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	bootstrapapi "k8s.io/cluster-bootstrap/token/api"

	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	legacysa "k8s.io/kubernetes/pkg/serviceaccount"

	"github.com/kproxy/kproxy/internal/credential"
)

// Explanations of authentication that upstream does not give: which kind
// of authenticator accepted the caller, and what is wrong with a rejected
// credential. They read the credential's public parts only (a JWT's
// claims, a bootstrap token's id); a secret never enters an explanation.

// acceptedBy names the authenticator that accepted u, from what the
// authenticators leave in the identity and, for opaque tokens, from the
// member of the chain that accepted it ("" when not known).
func acceptedBy(u user.Info, r *http.Request, requestHeader bool, member string) string {
	if u == nil {
		return "no authenticator"
	}
	cred := ""
	if ids := u.GetExtra()["authentication.kubernetes.io/credential-id"]; len(ids) > 0 {
		cred = ids[0]
	}
	switch {
	case u.GetName() == user.Anonymous:
		return "the anonymous authenticator (no credentials)"
	case requestHeader:
		return "the front-proxy (requestheader) authenticator"
	case strings.HasPrefix(cred, "X509SHA256="):
		return "the x509 client-certificate authenticator (--client-ca-file)"
	case strings.HasPrefix(u.GetName(), "system:bootstrap:"):
		return "the bootstrap-token authenticator"
	case strings.HasPrefix(u.GetName(), serviceaccount.ServiceAccountUsernamePrefix):
		what := "the service-account token authenticator"
		if pod := u.GetExtra()[serviceaccount.PodNameKey]; len(pod) > 0 {
			what += fmt.Sprintf(" (token bound to pod %q)", pod[0])
		}
		return what
	case strings.HasPrefix(cred, "JTI="):
		return "a JWT authenticator (--authentication-config / --oidc-*)"
	case certificateOnly(r):
		return "the x509 client-certificate authenticator (--client-ca-file)"
	}
	switch member {
	case "token-file":
		return "a token authenticator (--token-auth-file)"
	case "token-webhook":
		return "a token authenticator (the token webhook)"
	}
	return "a token authenticator (--token-auth-file, or the token webhook)"
}

// certificateOnly reports a request whose only credential is its client
// certificate.
func certificateOnly(r *http.Request) bool {
	c := credential.Inspect(r)
	return c.HasCertificate() && !c.HasTokenCredential()
}

var bootstrapTokenRE = regexp.MustCompile(bootstrapapi.BootstrapTokenPattern)

// describeToken says what a rejected bearer token is, from its public
// parts: a JWT's issuer, audiences, subject and expiry, checked against
// what the apiserver accepts; a bootstrap token's id.
func (m *machinery) describeToken(r *http.Request, now time.Time) string {
	tok := credential.Inspect(r).Token
	if tok == "" {
		return ""
	}
	if b := bootstrapTokenRE.FindStringSubmatch(tok); b != nil {
		return fmt.Sprintf("the token has the bootstrap-token form (id %q): the apiserver checks Secret kube-system/bootstrap-token-%s (it must exist, not be expired, carry usage-bootstrap-authentication: \"true\", and match the token's secret), and needs --enable-bootstrap-token-auth", b[1], b[1])
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "the token is not a JWT: only --token-auth-file or a token webhook could accept it, and none did"
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "the token looks like a JWT but its claims are not base64url: no authenticator can read it"
	}
	var c struct {
		Iss string          `json:"iss"`
		Sub string          `json:"sub"`
		Aud json.RawMessage `json:"aud"`
		Exp *int64          `json:"exp"`
		Nbf *int64          `json:"nbf"`
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return "the token looks like a JWT but its claims are not JSON"
	}
	var aud []string
	if json.Unmarshal(c.Aud, &aud) != nil {
		var one string
		if json.Unmarshal(c.Aud, &one) == nil && one != "" {
			aud = []string{one}
		}
	}
	var notes []string
	notes = append(notes, fmt.Sprintf("the token is a JWT from issuer %q for subject %q and audiences %v", c.Iss, c.Sub, aud))
	if c.Exp != nil {
		exp := time.Unix(*c.Exp, 0).UTC()
		if now.After(exp) {
			notes = append(notes, fmt.Sprintf("it expired at %s", exp.Format(time.RFC3339)))
		}
	}
	if c.Nbf != nil {
		if nbf := time.Unix(*c.Nbf, 0).UTC(); now.Before(nbf) {
			notes = append(notes, fmt.Sprintf("it is not valid before %s", nbf.Format(time.RFC3339)))
		}
	}
	// A legacy token (a Secret's, issuer kubernetes/serviceaccount) has no
	// audience, and the service-account authenticator gives it the
	// apiserver's own: its audiences are never why it is refused (found by
	// a probe, on every refused legacy token).
	legacy := c.Iss == legacysa.LegacyIssuer
	if len(m.apiAudiences) > 0 && !legacy && !intersects(aud, m.apiAudiences) && strings.HasPrefix(c.Sub, serviceaccount.ServiceAccountUsernamePrefix) {
		notes = append(notes, fmt.Sprintf("none of its audiences is one the apiserver accepts (%v)", []string(m.apiAudiences)))
	}
	if len(m.saIssuers) > 0 && strings.HasPrefix(c.Sub, serviceaccount.ServiceAccountUsernamePrefix) && !contains(m.saIssuers, c.Iss) && !legacy {
		notes = append(notes, fmt.Sprintf("its issuer is not one of --service-account-issuer %v", m.saIssuers))
	}
	switch {
	case !strings.HasPrefix(c.Sub, serviceaccount.ServiceAccountUsernamePrefix) || len(notes) > 1:
	case legacy:
		notes = append(notes, "it is a legacy token, a Secret's: if its signature is valid, the Secret or its service account no longer exists (or has another UID), "+
			"the Secret holds another token, or it is labelled "+legacysa.InvalidSinceLabelKey+" (the legacy-token cleaner's mark)")
	default:
		notes = append(notes, "if its signature is valid, the service account, or the pod, secret or node it is bound to, no longer exists (or has another UID)")
	}
	return strings.Join(notes, "; ")
}

func intersects(a, b []string) bool {
	for _, x := range a {
		if contains(b, x) {
			return true
		}
	}
	return false
}

func contains(set []string, s string) bool {
	for _, x := range set {
		if x == s {
			return true
		}
	}
	return false
}
