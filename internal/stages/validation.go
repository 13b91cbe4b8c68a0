package stages

import "context"

// validation replays the validation stage: the registry strategy: PrepareForCreate/Update and Validate.
type validation struct{}

func newValidation(*machinery) Stage { return validation{} }

func (validation) Name() string { return "validation" }

func (validation) Run(context.Context, *Request) Result { return notModelled() }
