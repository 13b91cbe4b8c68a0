package stages

import "context"

// mutatingAdmission replays the mutating-admission stage: mutating admission plugins, MutatingAdmissionPolicy, mutating webhooks.
type mutatingAdmission struct{}

func newMutatingAdmission(*machinery) Stage { return mutatingAdmission{} }

func (mutatingAdmission) Name() string { return "mutating-admission" }

func (mutatingAdmission) Run(context.Context, *Request) Result { return notModelled() }
