package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/server/egressselector"
	kubeletclient "k8s.io/kubernetes/pkg/kubelet/client"

	"github.com/kproxy/kproxy/internal/record"
)

// Connect subresources (pods/log, exec, attach, portforward, and the proxy
// subresources of pods, services and nodes) run through the apiserver's
// own handler and registry: the object is read, the options decoded,
// admission asked, and the registry's location code decides where the
// request would go (a pod without a node, a container that is not there,
// a Service without endpoints are the apiserver's own answers). What the
// kubelet, or the backend a proxy reaches, would answer is not kproxy's to
// know, and kproxy never connects to either: the replay server's dialer
// for kubelets and its proxy transport refuse, and a run that reached them
// is unknown, saying so.

// connectSubresource reports the subresources served by a connect
// handler (rest.Connecter).
func connectSubresource(sub string) bool {
	switch sub {
	case "exec", "attach", "portforward", "proxy":
		return true
	}
	return false
}

// errBackend is the replay's refusal to reach a kubelet or a proxied
// backend; its text marks a handler's answer that came from that refusal.
var errBackend = errors.New(backendRefusal)

const backendRefusal = "kproxy-replay-never-dials-kubelets-or-backends"

// backendReached says what the request would have reached, for the unknown
// verdict.
func backendReached(addr string) string {
	return fmt.Sprintf("the apiserver would now connect to %s (a kubelet, or the backend of a proxy; the address as kproxy reads it now): only it answers from here, and kproxy never connects to kubelets or proxied backends", addr)
}

// upgradeReached is the unknown verdict of a request the apiserver takes
// over before it dials anything (a WebSocket exec, attach or port-forward).
const upgradeReached = "the apiserver would now switch protocols (101, a WebSocket stream) and then connect to the pod's kubelet: only the kubelet answers from here, and kproxy never connects to kubelets"

// refuseDial is the replay server's dialer for kubelets.
func refuseDial(ctx context.Context, network, addr string) (net.Conn, error) {
	if run := runFrom(ctx); run != nil {
		run.markUnknown(backendReached(addr))
	}
	return nil, errBackend
}

// replayKubeletConfig is the apiserver's kubelet client configuration
// (ports, preferred address types) with the refusing dialer and no
// credentials: the location code runs as it does there, nothing dials.
func replayKubeletConfig(c kubeletclient.KubeletClientConfig) kubeletclient.KubeletClientConfig {
	c.TLSClientConfig = kubeletclient.KubeletTLSConfig{}
	c.Lookup = kubeletLookup
	return c
}

// kubeletLookup gives the kubelet client the refusing dialer (the egress
// selector's hook, which kube-apiserver uses to route kubelet traffic).
func kubeletLookup(egressselector.NetworkContext) (utilnet.DialFunc, error) {
	return refuseDial, nil
}

// refusingTransport is the replay server's proxy transport (pods/proxy,
// services/proxy, nodes/proxy): it dials nothing.
func refusingTransport() *http.Transport {
	return &http.Transport{
		DialContext:    refuseDial,
		DialTLSContext: refuseDial,
		Proxy:          nil,
	}
}

// reachedBackend reports a handler answer that carries the refusal (when
// the context did not reach the dialer).
func reachedBackend(msg string) bool { return strings.Contains(msg, backendRefusal) }

// connectedLate says why the registry's refusal of a connect request (a
// log, exec, attach, port-forward or proxy: no endpoints ready, an
// address not allowed, a pod without an IP or a node) is not the
// request's, or "": the apiserver answered otherwise. The registry finds
// where to connect from state the replay reads after the request arrived,
// from its informers (endpoints) or the latest objects (the Service, the
// pod, the node), and that state moves all the time: a probe made an
// endpoint unready, or changed a pod's IP, 50 ms after a burst of proxied
// GETs, and the replays behind a queue predicted 503 and 400 for the
// apiserver's 200.
func (r *Run) connectedLate(ctx context.Context) string {
	if r.actual == nil || r.Status == nil || r.Decided != record.StageStorage || (!connectSubresource(r.Subresource) && r.Subresource != "log") {
		return ""
	}
	aw, ok := r.actual(ctx)
	if !ok || aw.Status == 0 || aw.Status == int(r.Status.Code) {
		return ""
	}
	return fmt.Sprintf("the apiserver answered %d, and the replay's registry refused the %s (%d: %s): it finds where to connect from state read after the request arrived "+
		"(the Service's endpoints, the pod's IP and node, the node's addresses), which may have changed since, so the state the request met is not known",
		aw.Status, r.Subresource, r.Status.Code, r.Status.Message)
}

// connectAsDryRun makes a CONNECT look like a dry run to admission: the
// apiserver never marks CONNECT requests as dry runs, so the webhook
// dispatchers would call a webhook with side effects; told it is a dry
// run, they call only webhooks that declare none (sideEffects: None, with
// dryRun true in the review) and refuse the others, which makes the
// replay unknown (noticeSideEffects).
func connectAsDryRun(a admission.Attributes) admission.Attributes {
	if a.GetOperation() != admission.Connect || a.IsDryRun() {
		return a
	}
	return dryRunAttributes{a}
}

type dryRunAttributes struct{ admission.Attributes }

func (dryRunAttributes) IsDryRun() bool { return true }
