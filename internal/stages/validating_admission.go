package stages

import "context"

// validatingAdmission replays the validating-admission stage: validating admission plugins, ValidatingAdmissionPolicy, validating webhooks.
type validatingAdmission struct{}

func newValidatingAdmission(*machinery) Stage { return validatingAdmission{} }

func (validatingAdmission) Name() string { return "validating-admission" }

func (validatingAdmission) Run(context.Context, *Request) Result { return notModelled() }
