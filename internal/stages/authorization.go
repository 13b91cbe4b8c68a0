package stages

import "context"

// authorization replays the authorization stage: the authorizer chain in --authorization-mode order.
type authorization struct{}

func newAuthorization(Config) Stage { return authorization{} }

func (authorization) Name() string { return "authorization" }

func (authorization) Run(context.Context, *Request) Result { return notModelled() }
