package source

import (
	"context"

	"github.com/kproxy/kproxy/internal/flowapi"
)

// API is kproxy serve's live feed (--api-listen): every buffered flow that
// matches filter (a filter expression, "" for all), then each new one as
// it is recorded, until ctx ends. A lost connection is re-established with
// backoff by the client, each step reported as a Status; records the
// server dropped because this reader fell behind are counted in Missed.
// Run returns an error only for what reconnecting cannot fix (a filter the
// server refuses, credentials it does not accept).
//
// Its Name is "kproxy flow API": the client does not tell its address,
// so wrap it with Named to show the URL.
func API(c *flowapi.Client, filter string) Source {
	return &apiSource{c: c, filter: filter}
}

type apiSource struct {
	c      *flowapi.Client
	filter string
}

func (s *apiSource) Name() string { return "kproxy flow API" }

// streamItem is one stream event, or how the stream ended.
type streamItem struct {
	ev  flowapi.StreamEvent
	end bool
	err error
}

// apiQueue is how many stream events may wait to be batched; when it is
// full the stream stops reading, and the server drops (and counts) what
// this reader cannot take.
const apiQueue = 4 * BatchSize

// Run implements Source.
func (s *apiSource) Run(ctx context.Context, out chan<- Event) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	items := make(chan streamItem, apiQueue)
	go func() {
		err := s.c.Stream(ctx, flowapi.StreamOptions{Filter: s.filter, Backlog: -1}, func(ev flowapi.StreamEvent) {
			select {
			case items <- streamItem{ev: ev}:
			case <-ctx.Done():
			}
		})
		select {
		case items <- streamItem{end: true, err: err}:
		case <-ctx.Done():
		}
	}()
	b := &batcher{out: out}
	for {
		var it streamItem
		select {
		case it = <-items:
		case <-ctx.Done():
			return nil
		}
		var err error
		switch {
		case it.end:
			if ctx.Err() != nil {
				return nil
			}
			if ferr := b.flush(ctx); ferr != nil {
				return nil
			}
			return it.err
		case it.ev.Record != nil:
			err = b.add(ctx, it.ev.Record)
		case it.ev.Status != "":
			b.missed += it.ev.Missed
			err = b.status(ctx, it.ev.Status)
		default:
			b.missed += it.ev.Missed
		}
		if err == nil && len(items) == 0 {
			// Caught up with the stream: deliver now.
			err = b.flush(ctx)
		}
		if err != nil {
			return nil
		}
	}
}

// Named gives src another name (the API's URL, say) and leaves everything
// else as it is.
func Named(name string, src Source) Source { return named{name: name, Source: src} }

type named struct {
	name string
	Source
}

func (n named) Name() string { return n.name }
