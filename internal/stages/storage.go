package stages

import "context"

// storage replays the storage stage: etcd key, encoding, size limit, existence and resourceVersion preconditions.
type storage struct{}

func newStorage(*machinery) Stage { return storage{} }

func (storage) Name() string { return "storage" }

func (storage) Run(context.Context, *Request) Result { return notModelled() }
