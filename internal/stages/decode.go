package stages

import "context"

// decode replays the decode stage: content type, body decoding, defaulting, conversion, query options.
type decode struct{}

func newDecode(*machinery) Stage { return decode{} }

func (decode) Name() string { return "decode" }

func (decode) Run(context.Context, *Request) Result { return notModelled() }
