package stages

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	aggregatorinformers "k8s.io/kube-aggregator/pkg/client/informers/externalversions"
)

// Conditional discovery. kubectl and every client-go program cache the
// aggregated discovery documents of /api and /apis and ask again with
// If-None-Match; the apiserver answers 304 when the client's ETag is the
// SHA-512 of its current document. That document is the aggregator's
// (built-in groups, CustomResourceDefinitions, APIServices), which the
// replay server does not assemble, so its ETag is read from the apiserver
// itself, as cluster state: once, then again after CustomResourceDefinitions
// or APIServices change. The aggregator updates its document a moment after
// such a change, so for a while after one the ETag is read every time.

// discoveryETags caches the apiserver's ETag of each aggregated discovery
// root.
type discoveryETags struct {
	http *http.Client
	base string
	now  func() time.Time

	mu      sync.Mutex
	etags   map[string]string
	changed time.Time // the last change of what the documents list
}

// discoverySettle is how long after a change the ETags are read anew on
// every use.
const discoverySettle = 30 * time.Second

// aggregatedDiscovery is the media type of the aggregated documents.
const aggregatedDiscovery = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

func newDiscoveryETags(ctx context.Context, s *ClusterState, crds cache.SharedIndexInformer, now func() time.Time) (*discoveryETags, error) {
	hc, err := rest.HTTPClientFor(s.Config)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	d := &discoveryETags{http: hc, base: strings.TrimSuffix(s.Config.Host, "/"), now: now, etags: map[string]string{}}
	bump := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { d.invalidate() },
		UpdateFunc: func(any, any) { d.invalidate() },
		DeleteFunc: func(any) { d.invalidate() },
	}
	if _, err := crds.AddEventHandler(bump); err != nil {
		return nil, err
	}
	ac, err := aggregatorclient.NewForConfig(s.Config)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	f := aggregatorinformers.NewSharedInformerFactory(ac, 0)
	if _, err := f.Apiregistration().V1().APIServices().Informer().AddEventHandler(bump); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	return d, nil
}

func (d *discoveryETags) invalidate() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.etags = map[string]string{}
	d.changed = d.now()
}

// etag returns the apiserver's current ETag of the aggregated discovery
// document at path (/api or /apis), quoted as in its ETag header.
func (d *discoveryETags) etag(ctx context.Context, path string) (string, error) {
	d.mu.Lock()
	e, ok := d.etags[path]
	settled := d.now().Sub(d.changed) > discoverySettle
	d.mu.Unlock()
	if ok && settled {
		return e, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.base+path, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", aggregatedDiscovery)
	resp, err := d.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("kproxy could not read the apiserver's discovery document %s: %w", path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	e = resp.Header.Get("ETag")
	if resp.StatusCode != http.StatusOK || e == "" {
		return "", fmt.Errorf("the apiserver answered kproxy's read of %s with %s and no ETag", path, resp.Status)
	}
	d.mu.Lock()
	d.etags[path] = e
	d.mu.Unlock()
	return e, nil
}
