package stages

import "context"

// authentication replays the authentication stage: who the caller is: the authenticator union (x509, tokens, service accounts, OIDC, webhook, anonymous).
type authentication struct{}

func newAuthentication(Config) Stage { return authentication{} }

func (authentication) Name() string { return "authentication" }

func (authentication) Run(context.Context, *Request) Result { return notModelled() }
