package stages

import "context"

// impersonation replays the impersonation stage: Impersonate-* headers, classic and constrained.
type impersonation struct{}

func newImpersonation(Config) Stage { return impersonation{} }

func (impersonation) Name() string { return "impersonation" }

func (impersonation) Run(context.Context, *Request) Result { return notModelled() }
