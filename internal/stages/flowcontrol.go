package stages

import "context"

// flowControl replays the flowcontrol stage: API Priority and Fairness: FlowSchema and PriorityLevel, or max-in-flight.
type flowControl struct{}

func newFlowControl(Config) Stage { return flowControl{} }

func (flowControl) Name() string { return "flowcontrol" }

func (flowControl) Run(context.Context, *Request) Result { return notModelled() }
