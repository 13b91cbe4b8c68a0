package apiserver

import (
	"context"

	"gopkg.in/go-jose/go-jose.v2/jwt"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/kubernetes/pkg/serviceaccount"
)

// TokenRequest (serviceaccounts/token) is replayed through the registry's
// own TokenREST: the service account, the bound object (pod, node,
// secret, webhook configuration) and its UID, the audiences, the
// expiration rules are checked by its code. Only the signature is not
// kproxy's to make: the apiserver signs with a private key kproxy never
// holds, so the replay server's issuer hands back a placeholder, which
// never leaves the replay.

// placeholderIssuer stands in for the apiserver's token signer.
type placeholderIssuer struct{}

var _ serviceaccount.TokenGenerator = placeholderIssuer{}

func (placeholderIssuer) GenerateToken(context.Context, *jwt.Claims, interface{}) (string, error) {
	return "kproxy-replay-placeholder-not-a-token", nil
}

// replayIssuer is the replay server's token issuer: the placeholder when
// the apiserver issues tokens (it has a --service-account-issuer), none
// otherwise, so that the token subresource is served exactly when it is
// there.
func replayIssuer(o *Options) serviceaccount.TokenGenerator {
	sa := o.Authentication.ServiceAccounts
	if sa == nil || len(sa.Issuers) == 0 || sa.Issuers[0] == "" {
		return nil
	}
	return placeholderIssuer{}
}

// apiAudiences are the apiserver's --api-audiences, defaulting to its
// service-account issuers as kube-apiserver defaults them.
func apiAudiences(o *Options) authenticator.Audiences {
	auds := o.Authentication.APIAudiences
	if sa := o.Authentication.ServiceAccounts; len(auds) == 0 && sa != nil && len(sa.Issuers) > 0 {
		auds = authenticator.Audiences(sa.Issuers)
	}
	return auds
}
