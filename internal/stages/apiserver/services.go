package apiserver

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/util/proxy"
	networkingv1client "k8s.io/client-go/kubernetes/typed/networking/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/registry/core/service/allocator"
	"k8s.io/kubernetes/pkg/registry/core/service/ipallocator"
	"k8s.io/kubernetes/pkg/registry/core/service/portallocator"
	servicestore "k8s.io/kubernetes/pkg/registry/core/service/storage"
	netutils "k8s.io/utils/net"
)

// Services that name their own cluster IPs or node ports. The apiserver
// checks those (in range, not taken) only when it really allocates them;
// a dry run checks neither the owner of an IP nor the range of a node
// port. kproxy replays every write in dry run, so for a Service write that
// is not itself a dry run, the replay runs the Service registry's own
// allocation code as a real allocation, against the cluster's current
// allocations, in memory:
//
//   - cluster IPs: kube-apiserver's MetaAllocator over the cluster's
//     ServiceCIDRs and IPAddresses (kproxy's informers); the IPAddress it
//     would create is answered in memory (AlreadyExists when the cluster
//     has one for another Service), never sent;
//   - node ports: kube-apiserver's port allocator over --service-node-port-range,
//     filled afresh for each check with the node ports the cluster's
//     Services hold;
//   - the store under the registry answers the write as its dry run does
//     (allocationProbe), so nothing is written.
//
// The admission chain still sees a dry run (webhooks with side effects are
// never called). An allocation the request itself made (its IPAddress, or
// its Service's ports, already visible when the replay reads) is its own,
// not a conflict.

// allocationProbeKey marks a Service write whose registry runs as a real
// allocation over in-memory allocators.
type allocationProbeKey struct{}

func allocationProbe(ctx context.Context) bool {
	v, _ := ctx.Value(allocationProbeKey{}).(bool)
	return v
}

// serviceAllocation is the Service registry the replay installs in place of
// the provider's: the same REST code, with allocators that check the
// cluster's current allocations.
type serviceAllocation struct {
	mu    sync.Mutex // one Service write at a time: the allocators know whose it is
	ports *currentPorts
	rest  *servicestore.REST
	// write is the request whose write allocates now (under mu): the IP
	// allocator calls the IPAddress client without its context.
	write *allocatingWrite
	// ready waits until the IP allocators hold the ServiceCIDRs.
	ready func(context.Context)
}

// allocatingWrite is what the IPAddress client needs of the write the
// allocators run for.
type allocatingWrite struct {
	ctx context.Context
	run *Run
}

// done lets the write's run go once its allocations are over.
func (w *allocatingWrite) done() { w.ctx, w.run = nil, nil }

// newServiceAllocation builds the Service registry over the replay's
// storage with in-memory allocators.
func newServiceAllocation(getter generic.RESTOptionsGetter, s *ClusterState, primary, secondary net.IPNet, nodePorts utilnet.PortRange,
	endpoints proxy.EndpointSliceGetter, pods servicestore.PodStorage) (*serviceAllocation, *servicestore.StatusREST, rest.Storage, error) {
	nw := s.Informers.Networking().V1()
	write := &allocatingWrite{}
	mem := memNetworking{NetworkingV1Interface: s.Client.NetworkingV1(), ips: nw.IPAddresses().Lister(), admit: s.admitRead, write: write}
	ipAllocs := map[api.IPFamily]ipallocator.Interface{}
	var metas []*ipallocator.MetaAllocator
	for _, r := range []net.IPNet{primary, secondary} {
		if r.IP == nil {
			continue
		}
		a, err := ipallocator.NewMetaAllocator(mem, nw.ServiceCIDRs(), nw.IPAddresses(), netutils.IsIPv6CIDR(&r), nil)
		if err != nil {
			return nil, nil, nil, err
		}
		if _, ok := ipAllocs[a.IPFamily()]; !ok {
			ipAllocs[a.IPFamily()] = a
			metas = append(metas, a)
		}
	}
	cidrs := nw.ServiceCIDRs().Lister()
	ready := func(ctx context.Context) {
		// The MetaAllocator makes an allocator for each ServiceCIDR on
		// its own goroutine, after its informers sync: until it has, an
		// address in range is refused as out of it ("the provided
		// network does not match the current range"). A replay run
		// right after kproxy starts (the local engine's first case, on
		// a busy machine) had met that: 422 predicted for a free
		// clusterIP. Wait for it, as the apiserver is not ready before.
		_ = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			for _, a := range metas {
				if a.Free() == 0 && hasServiceCIDR(cidrs, a.IPFamily()) {
					return false, nil
				}
			}
			return true, nil
		})
	}
	family := api.IPv4Protocol
	if netutils.IsIPv6CIDR(&primary) {
		family = api.IPv6Protocol
	}
	ports := &currentPorts{rng: nodePorts, services: s.Informers.Core().V1().Services().Lister(),
		list: func(ctx context.Context) ([]corev1.Service, error) {
			if err := s.admitRead(); err != nil {
				return nil, err
			}
			l, err := s.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, err
			}
			return l.Items, nil
		}}
	svc, status, px, err := servicestore.NewREST(getter, family, ipAllocs, ports, endpoints, pods, refusingTransport())
	if err != nil {
		return nil, nil, nil, err
	}
	return &serviceAllocation{ports: ports, rest: svc, write: write, ready: ready}, status, px, nil
}

// hasServiceCIDR reports whether a ServiceCIDR not being deleted holds a
// range of family.
func hasServiceCIDR(cidrs networkinglisters.ServiceCIDRLister, family api.IPFamily) bool {
	l, err := cidrs.List(labels.Everything())
	if err != nil {
		return false
	}
	for _, c := range l {
		if c.DeletionTimestamp != nil {
			continue
		}
		for _, r := range c.Spec.CIDRs {
			if netutils.IsIPv6CIDRString(r) == (family == api.IPv6Protocol) {
				return true
			}
		}
	}
	return false
}

// probe reports whether a Service write's registry runs as a real
// allocation: the request itself is not a dry run.
func probe(ctx context.Context) bool {
	run := runFrom(ctx)
	return run != nil && !run.DryRun && !run.Read
}

// allocatingREST is the Service registry of the replay: a write that is
// not a dry run allocates for real, in memory.
type allocatingREST struct {
	*servicestore.REST
	a *serviceAllocation
}

func (r allocatingREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	if !probe(ctx) {
		return r.REST.Create(ctx, obj, createValidation, options)
	}
	r.a.ready(ctx)
	r.a.mu.Lock()
	defer r.a.mu.Unlock()
	r.a.write.ctx, r.a.write.run = ctx, runFrom(ctx)
	defer r.a.write.done()
	if svc, ok := obj.(*api.Service); ok {
		ns := svc.Namespace
		if ns == "" {
			ns, _ = genericapirequest.NamespaceFrom(ctx)
		}
		r.a.ports.begin(ns, svc.Name)
	}
	o := options.DeepCopy()
	o.DryRun = nil
	return r.REST.Create(context.WithValue(ctx, allocationProbeKey{}, true), obj, createValidation, o)
}

func (r allocatingREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	if !probe(ctx) {
		return r.REST.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
	}
	r.a.ready(ctx)
	r.a.mu.Lock()
	defer r.a.mu.Unlock()
	r.a.write.ctx, r.a.write.run = ctx, runFrom(ctx)
	defer r.a.write.done()
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	r.a.ports.begin(ns, name)
	o := options.DeepCopy()
	o.DryRun = nil
	return r.REST.Update(context.WithValue(ctx, allocationProbeKey{}, true), name, objInfo, createValidation, updateValidation, forceAllowCreate, o)
}

// memNetworking answers the IP allocator's IPAddress writes in memory: a
// create succeeds unless the cluster holds that address for another
// Service, a delete (a rollback) does nothing.
type memNetworking struct {
	networkingv1client.NetworkingV1Interface
	ips   networkinglisters.IPAddressLister
	admit func() error // the replay's budget of apiserver reads
	write *allocatingWrite
}

func (m memNetworking) IPAddresses() networkingv1client.IPAddressInterface {
	return memIPAddresses{IPAddressInterface: m.NetworkingV1Interface.IPAddresses(), ips: m.ips, admit: m.admit, write: m.write}
}

type memIPAddresses struct {
	networkingv1client.IPAddressInterface
	ips   networkinglisters.IPAddressLister
	admit func() error
	write *allocatingWrite
}

// Create checks the address with a consistent read through the apiserver
// (the informer may not yet have seen an address a Service created a
// moment before took: the replay then predicted a cluster IP free that
// the apiserver's allocation held), the informer being the fallback when
// the read fails or is shed.
func (m memIPAddresses) Create(ctx context.Context, ip *networkingv1.IPAddress, _ metav1.CreateOptions) (*networkingv1.IPAddress, error) {
	var have *networkingv1.IPAddress
	err := errors.New("not read")
	if m.admit == nil || m.admit() == nil {
		have, err = m.Get(ctx, ip.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return ip.DeepCopy(), nil
		}
	}
	if err != nil {
		have, err = m.ips.Get(ip.Name)
	}
	if err == nil && !ownAllocation(have, ip, m.write) {
		return nil, apierrors.NewAlreadyExists(networkingv1.Resource("ipaddresses"), ip.Name)
	}
	return ip.DeepCopy(), nil
}

// ownAllocation reports an IPAddress that is the request's own allocation,
// already visible to a replay that runs after the apiserver's write: held
// by the very Service being written, by a write the apiserver admitted
// (a refused one rolls its allocations back), and not clearly older than
// the request. Any other was there before the request, whoever it names:
// the apiserver's create of it fails as already allocated (found by a
// probe: an IPAddress left naming a Service that did not exist, then a
// create of that Service asking for the address, predicted 201 for the
// apiserver's 422).
func ownAllocation(have, want *networkingv1.IPAddress, w *allocatingWrite) bool {
	if !sameParent(have.Spec.ParentRef, want.Spec.ParentRef) {
		return false
	}
	if w == nil || w.run == nil {
		return true
	}
	if earlier, _ := markWindow(have.CreationTimestamp.Time, w.run.arrival); earlier {
		return false
	}
	if w.run.actual != nil {
		if aw, ok := w.run.actual(w.ctx); ok && aw.Status >= 300 {
			return false
		}
	}
	return true
}

func (m memIPAddresses) Delete(context.Context, string, metav1.DeleteOptions) error { return nil }

// sameParent reports an IPAddress held by the very Service being written:
// the request's own allocation, already visible.
func sameParent(a, b *networkingv1.ParentReference) bool {
	return a != nil && b != nil && a.Group == b.Group && a.Resource == b.Resource && a.Namespace == b.Namespace && a.Name == b.Name
}

// currentPorts is a node-port allocator that answers each call with
// kube-apiserver's port allocator filled with the node ports the cluster's
// Services hold now (but the written Service's own), and the ports this
// write allocated before: a Service naming one node port on two of its
// ports is refused at its second ("provided port is already allocated"),
// as the apiserver's allocator refuses it, before validation would call
// it a duplicate.
type currentPorts struct {
	rng      utilnet.PortRange
	services corelisters.ServiceLister
	// list is a consistent list of the Services, through the apiserver:
	// the informer may not have seen a Service created a moment before
	// the request (the replay then predicted a node port free that the
	// apiserver's allocation, updated with that create, held). The
	// informer is the fallback when the list fails or is shed.
	list func(context.Context) ([]corev1.Service, error)
	own  string // namespace/name of the Service being written
	// taken are the node ports the write allocated so far.
	taken []int
}

// begin starts a write of the Service ns/name.
func (c *currentPorts) begin(ns, name string) {
	c.own, c.taken = ns+"/"+name, nil
}

var _ portallocator.Interface = (*currentPorts)(nil)

func (c *currentPorts) now() *portallocator.PortAllocator {
	pa, err := portallocator.New(c.rng, func(max int, rangeSpec string, offset int) (allocator.Interface, error) {
		return allocator.NewAllocationMapWithOffset(max, rangeSpec, offset), nil
	})
	if err != nil {
		return nil
	}
	var svcs []*corev1.Service
	if c.list != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		items, err := c.list(ctx)
		cancel()
		if err == nil {
			for i := range items {
				svcs = append(svcs, &items[i])
			}
		}
	}
	if svcs == nil {
		svcs, _ = c.services.List(labels.Everything())
	}
	for _, s := range svcs {
		if s.Namespace+"/"+s.Name == c.own {
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.NodePort != 0 {
				_ = pa.Allocate(int(p.NodePort))
			}
		}
		if hc := s.Spec.HealthCheckNodePort; hc != 0 {
			_ = pa.Allocate(int(hc))
		}
	}
	for _, p := range c.taken {
		_ = pa.Allocate(p)
	}
	return pa
}

func (c *currentPorts) Allocate(port int) error {
	pa := c.now()
	if pa == nil {
		return portallocator.ErrAllocated
	}
	err := pa.Allocate(port)
	if err == nil {
		c.taken = append(c.taken, port)
	}
	return err
}

func (c *currentPorts) AllocateNext() (int, error) {
	pa := c.now()
	if pa == nil {
		return 0, portallocator.ErrFull
	}
	port, err := pa.AllocateNext()
	if err == nil {
		c.taken = append(c.taken, port)
	}
	return port, err
}

func (c *currentPorts) Release(port int) error {
	if i := slices.Index(c.taken, port); i >= 0 {
		c.taken = slices.Delete(c.taken, i, i+1)
	}
	return nil
}

func (c *currentPorts) ForEach(f func(int)) {
	if pa := c.now(); pa != nil {
		pa.ForEach(f)
	}
}

func (c *currentPorts) Has(port int) bool {
	pa := c.now()
	return pa != nil && pa.Has(port)
}

func (c *currentPorts) Destroy()       {}
func (c *currentPorts) EnableMetrics() {}
