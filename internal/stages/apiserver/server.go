package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	restful "github.com/emicklei/go-restful/v3"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	apiextensionslisters "k8s.io/apiextensions-apiserver/pkg/client/listers/apiextensions/v1"
	apiextensionsoptions "k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	webhookinit "k8s.io/apiserver/pkg/admission/plugin/webhook/initializer"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapifilters "k8s.io/apiserver/pkg/endpoints/filters"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/generic"
	registryrest "k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/apiserver/pkg/util/notfoundhandler"
	"k8s.io/apiserver/pkg/util/openapi"
	utilproxy "k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/component-base/tracing"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	apiregistrationv1beta1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1beta1"
	aggregatorapiserver "k8s.io/kube-aggregator/pkg/apiserver"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	apiservicerest "k8s.io/kube-aggregator/pkg/registry/apiservice/rest"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/capabilities"
	"k8s.io/kubernetes/pkg/controlplane"
	controlplaneapiserver "k8s.io/kubernetes/pkg/controlplane/apiserver"
	controlplaneadmission "k8s.io/kubernetes/pkg/controlplane/apiserver/admission"
	cpoptions "k8s.io/kubernetes/pkg/controlplane/apiserver/options"
	"k8s.io/kubernetes/pkg/controlplane/reconcilers"
	generatedopenapi "k8s.io/kubernetes/pkg/generated/openapi"
	"k8s.io/kubernetes/pkg/kubeapiserver"
	kubeapiserveradmission "k8s.io/kubernetes/pkg/kubeapiserver/admission"
	"k8s.io/kubernetes/pkg/kubeapiserver/admission/exclusion"
	quotainstall "k8s.io/kubernetes/pkg/quota/v1/install"
	servicestore "k8s.io/kubernetes/pkg/registry/core/service/storage"
	"k8s.io/utils/clock"
	netutils "k8s.io/utils/net"
)

// Server is kube-apiserver's resource handler for the built-in
// resources, assembled the way kube-apiserver assembles it: the REST
// storage of every API group (controlplane.StorageProviders), the
// registry strategies, the admission chain of the mirrored flags with its
// initializers, installed in a GenericAPIServer that never listens. Its
// storage only reads the cluster (snapshotStorage), and the replay sends
// every write through it in dry run, so nothing is ever written.
//
// The handler runs decode, mutating admission, validation, validating
// admission and the storage preconditions in the apiserver's own order; a
// Run in the request context watches it go by (which plugin ran, where
// it stopped), so that each stage reports its own part.
type Server struct {
	handler http.Handler
	// plugins are the enabled admission plugins, in the chain's order;
	// admissionChanges when kproxy last saw the state they read change.
	plugins          []string
	admissionChanges *admissionChanges
	// deletedPods are the pods NodeRestriction may read as a replay's
	// request met them (deleted_pods.go); nil without NodeRestriction.
	deletedPods *deletedPods
	// params reads the admission policies' params (policy_params.go).
	params *paramReads
	// limitRanges counts a namespace's LimitRanges (limit_ranges.go).
	limitRanges limitRangesIn
	// crds lists the cluster's CustomResourceDefinitions.
	crds apiextensionslisters.CustomResourceDefinitionLister
	// storage is every registry's storage (etcd keys, codecs); etcd the
	// read access to the apiserver's etcd, nil without --etcd-servers.
	storage *snapshotOptions
	etcd    *etcdAccess
	noEtcd  string // why etcd is not read, " (...)"
	// etcdLater: etcd could not be reached when the server was built;
	// a server built again may read it (EtcdUnreachable).
	etcdLater bool
	// served are what the apiserver serves about itself (served_docs.go).
	served *ServedDocs
	opts   *Options
}

// Config holds the server's collaborators: the mirrored flags, the
// cluster's state, the filter stages' authenticator and authorizer (the
// admission chain and some registries ask them), and what the replay
// injects.
type Config struct {
	Options       *Options
	State         *ClusterState
	Authenticator authenticator.Request
	Authorizer    authorizer.Authorizer
	// RuleResolver lists a user's rules (SelfSubjectRulesReview).
	RuleResolver authorizer.RuleResolver
	Clock        clock.PassiveClock
	// Explainer adds what an admission plugin's refusal leaves out.
	Explainer PluginExplainer
	// AuthzChanged names the authorizers' state kproxy saw change after
	// a time, or "" (nil: not watched).
	AuthzChanged func(time.Time) string
}

// Served is what kproxy read of the apiserver's documents about itself.
func (w *Server) Served() *ServedDocs { return w.served }

// CRDs lists the cluster's CustomResourceDefinitions.
func (w *Server) CRDs() apiextensionslisters.CustomResourceDefinitionLister { return w.crds }

// EtcdAccess says whether the server reads etcd directly (the apiserver's
// etcd3 store), or why it reads through the apiserver.
func (w *Server) EtcdAccess() (etcd bool, why string) {
	if w.etcd != nil {
		return true, ""
	}
	return false, strings.Trim(w.noEtcd, " ()")
}

// EtcdUnreachable reports a server that reads through the apiserver only
// because etcd could not be reached when it was built: built again once
// etcd answers, it reads etcd.
func (w *Server) EtcdUnreachable() bool { return w.etcdLater }

// InspectEtcd reads a registry key's etcd key directly, at revision rev
// (0: the latest); ok is false, with why, when kproxy cannot read etcd.
func (w *Server) InspectEtcd(ctx context.Context, registryKey string, rev int64) (kv EtcdKV, ok bool, why string) {
	if w.etcd == nil {
		return EtcdKV{}, false, w.noEtcd
	}
	return w.etcd.inspect(ctx, w.etcd.key(registryKey), rev), true, ""
}

// BuiltIn reports an API group kube-apiserver serves itself (custom
// resources and aggregated APIs are the others): its own groups, the
// apiextensions server's and the aggregator's.
func BuiltIn(group string) bool {
	return legacyscheme.Scheme.IsGroupRegistered(group) || group == apiextensionsv1.GroupName || group == apiregistrationv1.GroupName
}

// ServesDiscovery reports a request the replay server answers as the
// apiserver does: /version, /api, /api/v1 and the versions of built-in
// groups (any method: go-restful answers 405 to those it has no route
// for), and GETs of /apis (aggregated discovery) and of built-in
// groups (when kube-aggregator's own handlers do not answer them,
// stages/group_discovery.go). Not replayed: discovery of custom
// resource groups (the apiextensions discovery controller is not run),
// of aggregated APIs, health, OpenAPI and metrics.
func (w *Server) ServesDiscovery(method string, info *apirequest.RequestInfo) bool {
	p := strings.TrimSuffix(info.Path, "/")
	switch p {
	case "/version", "/api", "/api/v1":
		// go-restful web services, in the apiserver as in the replay:
		// a method they have no route for gets go-restful's 405.
		return true
	case "/apis":
		// Aggregated discovery (the aggregator's own legacy document is
		// answered before: stages/group_discovery.go).
		return method == http.MethodGet
	}
	rest, ok := strings.CutPrefix(p, "/apis/")
	if !ok {
		return false
	}
	group, version, _ := strings.Cut(rest, "/")
	if method != http.MethodGet && version == "" {
		// kube-aggregator's own group handler, not a web service.
		return false
	}
	// The apiextensions group's own versions are its server's web
	// services, in the apiserver as in the replay; the group itself is
	// the aggregator's (stages/group_discovery.go).
	return BuiltIn(group) && (group != apiextensionsv1.GroupName || version != "")
}

// DiscoveryRoot reports /api and /apis: in the apiserver the aggregator
// serves them, and only their successes are the replay's to predict.
func DiscoveryRoot(info *apirequest.RequestInfo) bool {
	p := strings.TrimSuffix(info.Path, "/")
	return p == "/api" || p == "/apis"
}

// ServesCustom reports whether an established CustomResourceDefinition
// serves group/resource.
func (w *Server) ServesCustom(group, resource string) bool {
	crd, err := w.crds.Get(resource + "." + group)
	return err == nil && Established(crd)
}

// Established reports a CustomResourceDefinition whose resources are
// served.
func Established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// New follows kube-apiserver's CreateKubeAPIServerConfig and
// BuildGenericConfig with the parts that touch the outside world replaced:
// the loopback client is kproxy's read-only client, the storage is
// snapshotStorage.
func New(ctx context.Context, c Config) (*Server, error) {
	o, s, authn, authz, rules, clk, explain := c.Options, c.State, c.Authenticator, c.Authorizer, c.RuleResolver, c.Clock, c.Explainer
	if clk == nil {
		clk = clock.RealClock{}
	}
	// Process-global, as in kube-apiserver: privileged containers pass
	// validation only with --allow-privileged.
	capabilities.Setup(o.AllowPrivileged, 0)

	ev := basecompatibility.NewEffectiveVersionFromString(strings.TrimPrefix(KubernetesVersion, "v"), "", "")
	gc := genericapiserver.NewConfig(legacyscheme.Codecs)
	// The replay's apiserver records no spans of its own: they would show
	// work (etcd writes, a response serialized) the real apiserver did,
	// not the replay. NewConfig's provider is already a no-op; it is set
	// here because the webhook clients below take it (they still pass
	// traceparent on). The spans its handlers start from the request's
	// context are dropped by the replay's provider (stages.replayTracing).
	gc.TracerProvider = tracing.NewNoopTracerProvider()
	gc.EffectiveVersion = ev
	gc.ExternalAddress = "kproxy-replay:443"
	// --runtime-config, merged as kube-apiserver merges it.
	enablement := runtimeConfig(o)
	if err := enablement.ApplyTo(gc, controlplane.DefaultAPIResourceConfigSource(), legacyscheme.Scheme); err != nil {
		return nil, fmt.Errorf("--runtime-config: %w", err)
	}
	gc.LoopbackClientConfig = loopbackConfig(s.Config)
	gc.Authentication.Authenticator = authn
	gc.Authorization.Authorizer = authz
	gc.RuleResolver = rules
	gc.Authentication.APIAudiences = apiAudiences(o)
	defs := openapi.GetOpenAPIDefinitionsWithoutDisabledFeatures(generatedopenapi.GetOpenAPIDefinitions)
	// As kube-apiserver names them (cmd/kube-apiserver/app/config.go):
	// with the apiextensions and aggregator schemes too, or the field
	// manager's type converter has no type for a CustomResourceDefinition
	// or an APIService, and a server-side apply of one fails (500 "no
	// corresponding type", found by a probe; kubectl apply --server-side
	// of a CRD is everyday traffic).
	namer := openapinamer.NewDefinitionNamer(legacyscheme.Scheme, apiextensionsapiserver.Scheme, aggregatorscheme.Scheme)
	gc.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(defs, namer)
	gc.OpenAPIConfig.Info.Title = "Kubernetes"
	gc.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(defs, namer)
	gc.OpenAPIV3Config.Info.Title = "Kubernetes"

	// The apiserver's storage factory: etcd keys, storage versions and
	// encodings per resource, exactly as kube-apiserver computes them.
	etcd := genericoptions.NewEtcdOptions(storagebackend.NewDefaultConfig(o.EtcdPrefix, nil))
	etcd.EnableWatchCache = false
	// As kube-apiserver: built-in objects are stored as protobuf, so the
	// dry-run store's encode/decode round trip is the real one.
	etcd.DefaultStorageMediaType = "application/vnd.kubernetes.protobuf"
	// The service IP and node-port allocators open raw etcd storage of
	// their own, used only to persist allocations, which dry run never
	// does. Their client waits for a ready gRPC connection: it gets a
	// gRPC server that serves nothing, and no compaction or polling.
	nowhere, err := emptyGRPCServer(ctx)
	if err != nil {
		return nil, err
	}
	etcd.StorageConfig.Transport.ServerList = []string{nowhere}
	etcd.StorageConfig.CompactionInterval = 0
	etcd.StorageConfig.DBMetricPollInterval = 0
	sf, err := storageFactory(ev, etcd, gc.MergedResourceConfig)
	if err != nil {
		return nil, fmt.Errorf("storage factory: %w", err)
	}
	// Encryption at rest: without it (a KMS v1 provider without its
	// feature gate, an unreadable file) the storage stage cannot size
	// encrypted values or read them from etcd, and says so; the rest of
	// the write path does not depend on it.
	transformers, encErr := loadTransformers(ctx, o)
	// Without etcd access the replay reads through the apiserver, and
	// says why.
	noEtcd := " (kproxy was not given --etcd-servers)"
	access, err := newEtcdAccess(ctx, o, transformers, clk)
	etcdLater := errors.Is(err, ErrEtcdUnreachable)
	switch {
	case err != nil:
		noEtcd = " (" + err.Error() + ")"
	case access != nil:
		noEtcd = ""
	}
	snapshots := &snapshotOptions{
		inner: &genericoptions.StorageFactoryRestOptionsFactory{Options: *etcd, StorageFactory: sf},
		state: s, resources: gc.MergedResourceConfig, scheme: legacyscheme.Scheme, decoder: legacyscheme.Codecs.UniversalDecoder(),
		etcd: access, noEtcd: noEtcd, stores: &storeRegistry{}, transformers: transformers, encErr: encErr, clock: clk,
		unencoded: &unencoded{},
	}
	gc.RESTOptionsGetter = snapshots

	// Admission, with the initializers kube-apiserver gives its plugins.
	loop := gc.LoopbackClientConfig
	svcResolver := aggregatorapiserver.NewClusterIPServiceResolver(s.Informers.Core().V1().Services().Lister())
	if u, err := url.Parse(loop.Host); err == nil {
		svcResolver = aggregatorapiserver.NewLoopbackServiceResolver(svcResolver, u)
	}
	kubeInit, err := (&kubeapiserveradmission.Config{}).New()
	if err != nil {
		return nil, fmt.Errorf("admission initializers: %w", err)
	}
	// controlplaneadmission.Config.New, with the webhooks' service dialer
	// watched: a webhook the apiserver reaches inside the cluster may be
	// out of kproxy's reach, and then the replay says so.
	authWrapper := watchServiceDials(webhook.NewDefaultAuthenticationInfoResolverWrapper(controlplaneapiserver.CreateProxyTransport(), nil, loop, gc.TracerProvider))
	quotaConfig, err := quotainstall.NewQuotaConfigurationForAdmission(s.Informers, sf.APIResourceConfigSource)
	if err != nil {
		return nil, fmt.Errorf("admission initializers: %w", err)
	}
	genericInit := []admission.PluginInitializer{
		webhookinit.NewPluginInitializer(authWrapper, svcResolver),
		controlplaneadmission.NewPluginInitializer(quotaConfig, exclusion.Excluded()),
	}
	// The policy plugins' dynamic informers (a custom resource's params)
	// list through it: kproxy sees whether they have (policy_params.go).
	lists := &listOutcomes{}
	dynCfg := rest.CopyConfig(loop)
	dynCfg.Wrap(lists.wrap)
	dyn, err := dynamic.NewForConfig(dynCfg)
	if err != nil {
		return nil, err
	}
	explainer := explain
	adm := *o.Admission.GenericAdmission
	var plugins []string
	adm.Decorators = append(append(admission.Decorators{}, adm.Decorators...), admission.DecoratorFunc(func(h admission.Interface, name string) admission.Interface {
		plugins = append(plugins, name)
		op := &observedPlugin{inner: h, name: name, explain: explainer}
		if name == "MutatingAdmissionWebhook" || name == "ValidatingAdmissionWebhook" {
			op.webhook = explainer.Webhook
		}
		return op
	}))
	ao := *o.Admission
	ao.GenericAdmission = &adm
	deleted := &deletedPods{clock: clk}
	// Last: the plugins that map kinds get kproxy's mapper (policy_mapper.go).
	inits := append(append(genericInit, kubeInit...), newFreshMapper(s.Client.Discovery(), clk))
	if err := ao.ApplyTo(gc, withDeletedPods(s.Informers, deleted), s.Client, dyn, utilfeature.DefaultFeatureGate, ev, inits...); err != nil {
		return nil, fmt.Errorf("admission chain (--enable-admission-plugins, --admission-control-config-file): %w", err)
	}
	if slices.Contains(plugins, "NodeRestriction") {
		deleted.watch(s.Informers.Core().V1().Pods().Informer())
	} else {
		deleted = nil
	}
	gc.AdmissionControl = &phaseMarker{inner: gc.AdmissionControl}

	// CustomResourceDefinitions and custom resources: the apiextensions
	// server kube-apiserver delegates to, built from a copy of the same
	// config (admission chain included), before it is completed.
	ext, err := buildAPIExtensions(ctx, *gc, *etcd, snapshots, enablement, svcResolver, authWrapper)
	if err != nil {
		return nil, fmt.Errorf("apiextensions (custom resources): %w", err)
	}

	// APIServices: the aggregator's own resource, which kube-apiserver
	// serves in front of everything else.
	aggregator, err := aggregatorAPI(*gc, *etcd, snapshots, enablement)
	if err != nil {
		return nil, fmt.Errorf("apiregistration.k8s.io (APIServices): %w", err)
	}

	endpointSlices, err := utilproxy.NewEndpointSliceIndexerGetter(s.Informers.Discovery().V1().EndpointSlices())
	if err != nil {
		return nil, fmt.Errorf("endpoint slices: %w", err)
	}
	primary, secondary, apiIP, err := serviceRanges(o.ServiceClusterIPRanges)
	if err != nil {
		return nil, err
	}
	cpc := &controlplane.Config{
		ControlPlane: controlplaneapiserver.Config{
			Generic: gc,
			Extra: controlplaneapiserver.Extra{
				APIResourceConfigSource: sf.APIResourceConfigSource,
				StorageFactory:          sf,
				EventTTL:                time.Hour,
				// pods/proxy, services/proxy, nodes/proxy: never dialed.
				ProxyTransport:     refusingTransport(),
				VersionedInformers: s.Informers,
				// As kube-apiserver: Services' endpoints from the
				// EndpointSlices (the proxy subresource).
				EndpointSliceGetter: endpointSlices,
				// TokenRequest: the registry's own checks, with a
				// placeholder in place of the apiserver's signer
				// (token.go); never a real token.
				ServiceAccountIssuer:                replayIssuer(o),
				ServiceAccountMaxExpiration:         o.Authentication.ServiceAccounts.MaxExpiration,
				ServiceAccountExtendedMaxExpiration: o.Authentication.ServiceAccounts.MaxExtendedExpiration,
				ExtendExpiration:                    o.Authentication.ServiceAccounts.ExtendExpiration,
			},
		},
		Extra: controlplane.Extra{
			// Logs, exec, attach, port-forward: the location code runs,
			// the kubelet is never dialed (connect.go).
			KubeletClientConfig:     replayKubeletConfig(o.Kubelet),
			ServiceIPRange:          primary,
			SecondaryServiceIPRange: secondary,
			APIServerServiceIP:      apiIP,
			APIServerServicePort:    443,
			ServiceNodePortRange:    o.ServiceNodePortRange,
			EndpointReconcilerType:  reconcilers.NoneEndpointReconcilerType,
			MasterCount:             1,
		},
	}
	completed := cpc.Complete()
	srv, err := completed.ControlPlane.Generic.New("kproxy-replay", ext.GenericAPIServer)
	if err != nil {
		return nil, fmt.Errorf("replay apiserver: %w", err)
	}
	client, err := kubernetes.NewForConfig(loop)
	if err != nil {
		return nil, err
	}
	providers, err := completed.StorageProviders(client)
	if err != nil {
		return nil, fmt.Errorf("REST storage: %w", err)
	}
	// The Service registry allocates for real, in memory (services.go).
	services := func(storage map[string]registryrest.Storage) error {
		if _, ok := storage["services"]; !ok {
			return nil
		}
		pods, _ := storage["pods"].(servicestore.PodStorage)
		sa, status, px, err := newServiceAllocation(gc.RESTOptionsGetter, s, primary, secondary, o.ServiceNodePortRange,
			endpointSlices, pods)
		if err != nil {
			return fmt.Errorf("the Service registry: %w", err)
		}
		storage["services"], storage["services/status"], storage["services/proxy"] = allocatingREST{REST: sa.rest, a: sa}, status, px
		return nil
	}
	if err := installAPIs(srv, sf.APIResourceConfigSource, gc.RESTOptionsGetter, providers, services, snapshots.unencoded); err != nil {
		return nil, err
	}
	if len(aggregator.VersionedResourcesStorageMap) > 0 {
		if err := srv.InstallAPIGroup(&aggregator); err != nil {
			return nil, fmt.Errorf("apiregistration.k8s.io (APIServices): %w", err)
		}
	}
	// The apiserver's router (handler.go sets a CurlyRouter), remembering
	// its choices (routes.go).
	srv.Handler.GoRestfulContainer.Router(newRouteCache(restful.CurlyRouter{}))
	served, err := newServedDocs(ctx, s, ext.Informers.Apiextensions().V1().CustomResourceDefinitions().Informer(), clk.Now)
	if err != nil {
		return nil, err
	}
	return &Server{handler: srv.Handler.Director, plugins: plugins, admissionChanges: watchAdmissionState(clk, s.Informers, plugins, c.AuthzChanged), deletedPods: deleted,
		crds:        ext.Informers.Apiextensions().V1().CustomResourceDefinitions().Lister(),
		params:      newParamReads(s.Informers, ext.Informers.Apiextensions().V1().CustomResourceDefinitions().Lister(), lists, plugins),
		limitRanges: newLimitRangesIn(s.Informers, plugins),
		storage:     snapshots, etcd: access, noEtcd: noEtcd, etcdLater: etcdLater, served: served, opts: o}, nil
}

// runtimeConfig is --runtime-config as kube-apiserver completes it: the
// legacy "v1", "api/v1" spellings mean the core group ("/v1"), and
// "api/legacy" is dropped.
func runtimeConfig(o *Options) *genericoptions.APIEnablementOptions {
	out := genericoptions.NewAPIEnablementOptions()
	if o.APIEnablement == nil {
		return out
	}
	for key, value := range o.APIEnablement.RuntimeConfig {
		switch {
		case key == "v1" || strings.HasPrefix(key, "v1/") || key == "api/v1" || strings.HasPrefix(key, "api/v1/"):
			out.RuntimeConfig["/v1"] = value
		case key == "api/legacy":
		default:
			out.RuntimeConfig[key] = value
		}
	}
	return out
}

// buildAPIExtensions is kube-apiserver's CreateAPIExtensionsConfig and
// the apiextensions server's New over snapshot storage. Its CRD informers
// are started here (kube-apiserver starts them in a post-start hook); its
// controllers, which write CRD status, are never started.
func buildAPIExtensions(ctx context.Context, gc genericapiserver.Config, etcd genericoptions.EtcdOptions, kube *snapshotOptions, enablement *genericoptions.APIEnablementOptions, svcResolver webhook.ServiceResolver, authWrapper webhook.AuthenticationInfoResolverWrapper) (*apiextensionsapiserver.CustomResourceDefinitions, error) {
	gc.PostStartHooks = map[string]genericapiserver.PostStartHookConfigEntry{}
	if err := groupStorage(&gc, etcd, apiextensionsapiserver.Codecs.LegacyCodec(apiextensionsv1beta1.SchemeGroupVersion, apiextensionsv1.SchemeGroupVersion),
		runtime.NewMultiGroupVersioner(apiextensionsv1beta1.SchemeGroupVersion, schema.GroupKind{Group: apiextensionsv1beta1.GroupName}),
		enablement, apiextensionsapiserver.DefaultAPIResourceConfigSource(), apiextensionsapiserver.Scheme); err != nil {
		return nil, err
	}
	s := kube.state
	gc.RESTOptionsGetter = &snapshotOptions{inner: gc.RESTOptionsGetter, state: s, resources: gc.MergedResourceConfig,
		scheme: apiextensionsapiserver.Scheme, decoder: apiextensionsapiserver.Codecs.UniversalDecoder(), etcd: kube.etcd, stores: kube.stores,
		transformers: kube.transformers, noEtcd: kube.noEtcd, clock: kube.clock}
	cfg := &apiextensionsapiserver.Config{
		GenericConfig: &genericapiserver.RecommendedConfig{Config: gc, SharedInformerFactory: s.Informers},
		ExtraConfig: apiextensionsapiserver.ExtraConfig{
			CRDRESTOptionsGetter: &snapshotOptions{inner: apiextensionsoptions.NewCRDRESTOptionsGetter(etcd, nil, nil), state: s, etcd: kube.etcd, stores: kube.stores, transformers: kube.transformers, noEtcd: kube.noEtcd, clock: kube.clock},
			MasterCount:          1,
			AuthResolverWrapper:  authWrapper,
			ServiceResolver:      svcResolver,
		},
	}
	// The end of kube-apiserver's chain (CreateServerChain): a path no
	// server of it serves is answered "404 page not found", not the
	// index of paths an empty delegate's server answers with.
	notFound := notfoundhandler.New(gc.Serializer, genericapifilters.NoMuxAndDiscoveryIncompleteKey)
	ext, err := cfg.Complete().New(genericapiserver.NewEmptyDelegateWithCustomHandler(notFound))
	if err != nil {
		return nil, err
	}
	ext.Informers.Start(ctx.Done())
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for typ, ok := range ext.Informers.WaitForCacheSync(wctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("%v not synced after 30s (kproxy's identity may lack list/watch on them)", typ)
		}
	}
	return ext, nil
}

// groupStorage gives gc storage of its own, as kube-apiserver gives each
// server of its chain (the apiextensions server, the aggregator): the
// same etcd options with the group's storage codec, and the group's
// resources enabled by --runtime-config over its defaults.
func groupStorage(gc *genericapiserver.Config, etcd genericoptions.EtcdOptions, codec runtime.Codec, encode runtime.GroupVersioner,
	enablement *genericoptions.APIEnablementOptions, defaults *serverstorage.ResourceConfig, scheme *runtime.Scheme) error {
	etcd.StorageConfig.Codec, etcd.StorageConfig.EncodeVersioner = codec, encode
	etcd.SkipHealthEndpoints = true
	gc.RESTOptionsGetter = nil
	if err := etcd.ApplyTo(gc); err != nil {
		return err
	}
	if err := enablement.ApplyTo(gc, defaults, scheme); err != nil {
		return fmt.Errorf("--runtime-config: %w", err)
	}
	return nil
}

// aggregatorAPI is the aggregator's APIService storage as kube-apiserver
// configures it (controlplane/apiserver/aggregator.go: its storage codec
// and resource enablement) over snapshot storage. Its controllers (the
// availability checks, the discovery merge) are not run: they write
// status and answer other paths.
func aggregatorAPI(gc genericapiserver.Config, etcd genericoptions.EtcdOptions, kube *snapshotOptions, enablement *genericoptions.APIEnablementOptions) (genericapiserver.APIGroupInfo, error) {
	if err := groupStorage(&gc, etcd, aggregatorscheme.Codecs.LegacyCodec(apiregistrationv1.SchemeGroupVersion, apiregistrationv1beta1.SchemeGroupVersion),
		runtime.NewMultiGroupVersioner(apiregistrationv1.SchemeGroupVersion, schema.GroupKind{Group: apiregistrationv1beta1.GroupName}),
		enablement, aggregatorapiserver.DefaultAPIResourceConfigSource(), aggregatorscheme.Scheme); err != nil {
		return genericapiserver.APIGroupInfo{}, err
	}
	getter := &snapshotOptions{inner: gc.RESTOptionsGetter, state: kube.state, resources: gc.MergedResourceConfig,
		scheme: aggregatorscheme.Scheme, decoder: aggregatorscheme.Codecs.UniversalDecoder(), etcd: kube.etcd, stores: kube.stores,
		transformers: kube.transformers, noEtcd: kube.noEtcd, clock: kube.clock, unencoded: kube.unencoded}
	return apiservicerest.NewRESTStorage(gc.MergedResourceConfig, getter, false), nil
}

// watchServiceDials wraps the webhooks' authentication-info resolver so
// that a failure to dial a Service-backed webhook makes the replay
// unknown: the apiserver reaches cluster IPs that kproxy, outside the
// cluster, often cannot. (URL webhooks and missing Services keep the
// apiserver's exact error.)
func watchServiceDials(inner webhook.AuthenticationInfoResolverWrapper) webhook.AuthenticationInfoResolverWrapper {
	return func(r webhook.AuthenticationInfoResolver) webhook.AuthenticationInfoResolver {
		return serviceDialWatcher{inner(r)}
	}
}

type serviceDialWatcher struct {
	webhook.AuthenticationInfoResolver
}

func (w serviceDialWatcher) ClientConfigForService(name, namespace string, port int) (*rest.Config, error) {
	cfg, err := w.AuthenticationInfoResolver.ClientConfigForService(name, namespace, port)
	if err != nil || cfg == nil {
		return cfg, err
	}
	cfg = watchDial(cfg, "served by Service "+namespace+"/"+name)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return shedGuard{rt} })
	return cfg, nil
}

func (w serviceDialWatcher) ClientConfigFor(hostPort string) (*rest.Config, error) {
	cfg, err := w.AuthenticationInfoResolver.ClientConfigFor(hostPort)
	if err != nil || cfg == nil {
		return cfg, err
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return shedGuard{rt} })
	return cfg, nil
}

// shedGuard keeps the replay from calling an admission webhook for a
// request the apiserver already shed for load (its plain-text 429, from
// API Priority and Fairness or max-in-flight): the apiserver never
// called the webhook for it, and under overload kproxy's calls would add
// load the cluster did not make (found by a probe: a slow webhook got
// five 3 s calls from kproxy for shed requests). The run says so, unknown;
// a replay that reaches the webhook before the answer calls it.
type shedGuard struct{ rt http.RoundTripper }

// shedWhy is the run's unknown for a webhook shedGuard did not call.
const shedWhy = "kproxy did not call the admission webhook: the apiserver had already shed the request for load (429), so it never called it, " +
	"and kproxy's replay makes no calls the apiserver did not"

func (g shedGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if run := runFrom(req.Context()); run != nil && run.answeredShed() {
		run.markUnknownHere(shedWhy)
		return nil, errors.New(shedWhy)
	}
	return g.rt.RoundTrip(req)
}

// watchDial makes a failed dial of a webhook the run's unknown.
func watchDial(cfg *rest.Config, where string) *rest.Config {
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 30 * time.Second}).DialContext
	}
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			if run := runFrom(ctx); run != nil {
				run.markUnknownHere(fmt.Sprintf("depends on an admission webhook %s, which kproxy could not reach (%v); the apiserver calls it from inside the cluster", where, err))
			}
		}
		return c, err
	}
	return cfg
}

// emptyGRPCServer serves gRPC with no services on a loopback port until
// ctx ends, and returns its URL.
func emptyGRPCServer(ctx context.Context) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("write path: %w", err)
	}
	g := grpc.NewServer()
	etcdserverpb.RegisterMaintenanceServer(g, etcdVersionOnly{})
	go func() { _ = g.Serve(l) }()
	context.AfterFunc(ctx, g.Stop)
	return "http://" + l.Addr().String(), nil
}

// etcdVersionOnly answers the etcd client's version check (its feature
// detection asks each endpoint's Status once) and nothing else.
type etcdVersionOnly struct {
	etcdserverpb.UnimplementedMaintenanceServer
}

func (etcdVersionOnly) Status(context.Context, *etcdserverpb.StatusRequest) (*etcdserverpb.StatusResponse, error) {
	return &etcdserverpb.StatusResponse{Version: "3.6.0"}, nil
}

// installAPIs is controlplaneapiserver.Server.InstallAPIs without the
// post-start hooks (controllers that would write to the cluster).
func installAPIs(srv *genericapiserver.GenericAPIServer, rc serverstorage.APIResourceConfigSource, getter generic.RESTOptionsGetter, providers []controlplaneapiserver.RESTStorageProvider, core func(map[string]registryrest.Storage) error, skip *unencoded) error {
	eval, err := genericapiserver.NewResourceExpirationEvaluatorFromOptions(genericapiserver.ResourceExpirationEvaluatorOptions{
		CurrentVersion:                          srv.EffectiveVersion.EmulationVersion(),
		Prerelease:                              srv.EffectiveVersion.BinaryVersion().PreRelease(),
		EmulationForwardCompatible:              srv.EmulationForwardCompatible,
		RuntimeConfigEmulationForwardCompatible: srv.RuntimeConfigEmulationForwardCompatible,
	})
	if err != nil {
		return err
	}
	var groups []*genericapiserver.APIGroupInfo
	for _, p := range providers {
		info, err := p.NewRESTStorage(rc, getter)
		if err != nil {
			return fmt.Errorf("API group %q: %w", p.GroupName(), err)
		}
		if len(info.VersionedResourcesStorageMap) == 0 {
			continue
		}
		if err := eval.RemoveUnavailableKinds(p.GroupName(), info.Scheme, info.VersionedResourcesStorageMap, rc); err != nil {
			return err
		}
		if len(info.VersionedResourcesStorageMap) == 0 {
			continue
		}
		info.NegotiatedSerializer = skip.wrap(info.NegotiatedSerializer)
		if p.GroupName() == "" {
			if err := core(info.VersionedResourcesStorageMap["v1"]); err != nil {
				return err
			}
			if err := srv.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, &info); err != nil {
				return fmt.Errorf("core API: %w", err)
			}
			continue
		}
		groups = append(groups, &info)
	}
	return srv.InstallAPIGroups(groups...)
}

// loopbackConfig is the read-only client configuration for the write
// path's own clients. A bearer token moves into the transport: the
// apiserver's config completion would otherwise trust it as the loopback
// identity (system:masters) in the authorizer.
func loopbackConfig(c *rest.Config) *rest.Config {
	c = rest.CopyConfig(c)
	c.ContentType = "application/vnd.kubernetes.protobuf"
	if tok := c.BearerToken; tok != "" {
		c.BearerToken = ""
		c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return transport.NewBearerAuthRoundTripper(tok, rt) })
	}
	return c
}

// serviceRanges is kube-apiserver's getServiceIPAndRanges for
// --service-cluster-ip-range.
func serviceRanges(flag string) (primary, secondary net.IPNet, apiServerIP net.IP, err error) {
	var parts []string
	if flag != "" {
		parts = strings.Split(flag, ",")
	}
	var first net.IPNet
	if len(parts) > 0 {
		_, cidr, err := netutils.ParseCIDRSloppy(parts[0])
		if err != nil {
			return primary, secondary, nil, fmt.Errorf("--service-cluster-ip-range[0] %q is not a valid CIDR", parts[0])
		}
		first = *cidr
	}
	primary, apiServerIP, err = cpoptions.ServiceIPRange(first)
	if err != nil {
		return primary, secondary, nil, fmt.Errorf("--service-cluster-ip-range: %w", err)
	}
	if len(parts) > 1 {
		_, cidr, err := netutils.ParseCIDRSloppy(parts[1])
		if err != nil {
			return primary, secondary, nil, fmt.Errorf("--service-cluster-ip-range[1] %q is not a valid CIDR", parts[1])
		}
		secondary = *cidr
	}
	return primary, secondary, apiServerIP, nil
}

// storageFactory is kube-apiserver's storage factory (etcd keys, storage
// versions and encodings per resource) for the resources served.
func storageFactory(ev basecompatibility.EffectiveVersion, etcd *genericoptions.EtcdOptions, resources *serverstorage.ResourceConfig) (*serverstorage.DefaultStorageFactory, error) {
	sfc := kubeapiserver.NewStorageFactoryConfigEffectiveVersion(ev)
	sfc.APIResourceConfig = resources
	sfc.DefaultResourceEncoding.SetEffectiveVersion(ev)
	return sfc.Complete(etcd).New()
}

// EtcdKey is the etcd key under which the apiserver stores an object,
// from its own storage factory (special prefixes such as services/specs
// and minions, --etcd-prefix); resource is "pods", "deployments.apps", or
// a custom resource's "plural.group".
func EtcdKey(o *Options, resource, namespace, name string) (string, error) {
	res, group, _ := strings.Cut(resource, ".")
	gr := schema.GroupResource{Group: group, Resource: res}
	prefix := gr.Group + "/" + gr.Resource // custom resources
	if BuiltIn(gr.Group) {
		ev := basecompatibility.NewEffectiveVersionFromString(strings.TrimPrefix(KubernetesVersion, "v"), "", "")
		etcd := genericoptions.NewEtcdOptions(storagebackend.NewDefaultConfig(o.EtcdPrefix, nil))
		sf, err := storageFactory(ev, etcd, controlplane.DefaultAPIResourceConfigSource())
		if err != nil {
			return "", err
		}
		prefix = sf.ResourcePrefix(gr)
	}
	key := strings.TrimSuffix(o.EtcdPrefix, "/") + "/" + strings.Trim(prefix, "/")
	if namespace != "" {
		key += "/" + namespace
	}
	return key + "/" + name, nil
}
