package apiserver

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	genericoptions "k8s.io/apiserver/pkg/server/options"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	kubeoptions "k8s.io/kubernetes/pkg/kubeapiserver/options"
	kubeletclient "k8s.io/kubernetes/pkg/kubelet/client"

	// Registers the Kubernetes feature gates, so --feature-gates knows them.
	_ "k8s.io/kubernetes/pkg/features"
)

// Options are the kube-apiserver flags the replay mirrors. They are
// parsed by kube-apiserver's own option structs, so every flag means exactly
// what it means to the apiserver, defaults included.
type Options struct {
	Authentication *kubeoptions.BuiltInAuthenticationOptions
	Authorization  *kubeoptions.BuiltInAuthorizationOptions
	// Flow control: API Priority and Fairness, or max-in-flight limits
	// when it is off (kube-apiserver's defaults).
	EnablePriorityAndFairness   bool
	MaxRequestsInFlight         int
	MaxMutatingRequestsInFlight int
	// EnableProfiling is --profiling: the apiserver serves /debug/pprof
	// and /debug/flags (unlisted in its index) only with it.
	EnableProfiling bool

	// The write path: the admission chain (--enable-admission-plugins,
	// --disable-admission-plugins, --admission-control-config-file) and
	// what the registry strategies read (--allow-privileged, the service
	// ranges, --etcd-prefix).
	Admission *kubeoptions.AdmissionOptions
	// APIEnablement is --runtime-config: the API versions and resources
	// served beyond (or short of) the defaults.
	APIEnablement          *genericoptions.APIEnablementOptions
	AllowPrivileged        bool
	ServiceClusterIPRanges string
	ServiceNodePortRange   utilnet.PortRange
	EtcdPrefix             string
	// etcd access and encryption at rest (kproxy etcd, the storage
	// stage): --etcd-servers, --etcd-cafile, --etcd-certfile,
	// --etcd-keyfile, --encryption-provider-config.
	EtcdServers                           []string
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	EncryptionProviderConfig              string
	// EtcdMaxRequestBytes is etcd's --max-request-bytes (not an apiserver
	// flag): the largest write etcd accepts.
	EtcdMaxRequestBytes int
	// Kubelet is how the apiserver finds a kubelet (--kubelet-port,
	// --kubelet-preferred-address-types, ...): the connect subresources'
	// location code uses it. kproxy never dials a kubelet.
	Kubelet kubeletclient.KubeletClientConfig
	// ReplayEtcdQPS (kproxy's own) bounds the replay's reads of etcd: past
	// it, reads are shed (predictions unknown) rather than load etcd.
	ReplayEtcdQPS float64
	// ReplayAPIServerQPS (kproxy's own) bounds a write replay's reads
	// through the apiserver alike.
	ReplayAPIServerQPS float64

	authnFlags, authzFlags, writeFlags, replayFlags *pflag.FlagSet
	fs                                              *pflag.FlagSet
}

// DefaultEtcdMaxRequestBytes is etcd's default --max-request-bytes.
const DefaultEtcdMaxRequestBytes = 1572864

// DefaultReplayEtcdQPS bounds the replay's etcd reads by default.
const DefaultReplayEtcdQPS = 200

// DefaultReplayAPIServerQPS bounds a write replay's reads through the
// apiserver by default (client-go's own default rate is 5; a kubectl
// session writes a few a second).
const DefaultReplayAPIServerQPS = 50

// NewOptions returns the options with kube-apiserver's defaults.
func NewOptions() *Options {
	return &Options{
		Authentication:              kubeoptions.NewBuiltInAuthenticationOptions().WithAll(),
		Authorization:               kubeoptions.NewBuiltInAuthorizationOptions(),
		EnablePriorityAndFairness:   true,
		MaxRequestsInFlight:         400,
		MaxMutatingRequestsInFlight: 200,
		EnableProfiling:             true,
		Admission:                   kubeoptions.NewAdmissionOptions(),
		APIEnablement:               genericoptions.NewAPIEnablementOptions(),
		ServiceNodePortRange:        kubeoptions.DefaultServiceNodePortRange,
		EtcdPrefix:                  "/registry",
		EtcdMaxRequestBytes:         DefaultEtcdMaxRequestBytes,
		ReplayEtcdQPS:               DefaultReplayEtcdQPS,
		ReplayAPIServerQPS:          DefaultReplayAPIServerQPS,
		Kubelet:                     defaultKubeletConfig(),
	}
}

// AddFlags adds the mirrored flags (--client-ca-file, --token-auth-file,
// --authorization-mode, --feature-gates, ...) to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.authnFlags = pflag.NewFlagSet("authentication", pflag.ContinueOnError)
	o.Authentication.AddFlags(o.authnFlags)
	o.authzFlags = pflag.NewFlagSet("authorization", pflag.ContinueOnError)
	o.Authorization.AddFlags(o.authzFlags)
	o.authzFlags.BoolVar(&o.EnablePriorityAndFairness, "enable-priority-and-fairness", o.EnablePriorityAndFairness,
		"kube-apiserver's --enable-priority-and-fairness: API Priority and Fairness, or max-in-flight limits when false")
	o.authzFlags.IntVar(&o.MaxRequestsInFlight, "max-requests-inflight", o.MaxRequestsInFlight, "kube-apiserver's --max-requests-inflight")
	o.authzFlags.IntVar(&o.MaxMutatingRequestsInFlight, "max-mutating-requests-inflight", o.MaxMutatingRequestsInFlight, "kube-apiserver's --max-mutating-requests-inflight")
	o.authzFlags.BoolVar(&o.EnableProfiling, "profiling", o.EnableProfiling,
		"kube-apiserver's --profiling: whether it serves /debug/pprof and /debug/flags (kproxy predicts their 404 only when told false)")
	o.writeFlags = pflag.NewFlagSet("write path", pflag.ContinueOnError)
	o.Admission.AddFlags(o.writeFlags)
	o.APIEnablement.AddFlags(o.writeFlags)
	o.writeFlags.BoolVar(&o.AllowPrivileged, "allow-privileged", o.AllowPrivileged, "kube-apiserver's --allow-privileged: privileged containers pass validation")
	o.writeFlags.StringVar(&o.ServiceClusterIPRanges, "service-cluster-ip-range", o.ServiceClusterIPRanges, "kube-apiserver's --service-cluster-ip-range")
	o.writeFlags.Var(&o.ServiceNodePortRange, "service-node-port-range", "kube-apiserver's --service-node-port-range")
	o.writeFlags.StringVar(&o.EtcdPrefix, "etcd-prefix", o.EtcdPrefix, "kube-apiserver's --etcd-prefix: the prefix of every etcd key")
	o.writeFlags.StringSliceVar(&o.EtcdServers, "etcd-servers", o.EtcdServers, "kube-apiserver's --etcd-servers: etcd to read directly (kproxy only reads)")
	o.writeFlags.StringVar(&o.EtcdCAFile, "etcd-cafile", o.EtcdCAFile, "kube-apiserver's --etcd-cafile")
	o.writeFlags.StringVar(&o.EtcdCertFile, "etcd-certfile", o.EtcdCertFile, "kube-apiserver's --etcd-certfile")
	o.writeFlags.StringVar(&o.EtcdKeyFile, "etcd-keyfile", o.EtcdKeyFile, "kube-apiserver's --etcd-keyfile")
	o.writeFlags.StringVar(&o.EncryptionProviderConfig, "encryption-provider-config", o.EncryptionProviderConfig, "kube-apiserver's --encryption-provider-config: decrypts values encrypted at rest (the file holds keys; kproxy never prints them)")
	o.writeFlags.StringSliceVar(&o.Kubelet.PreferredAddressTypes, "kubelet-preferred-address-types", o.Kubelet.PreferredAddressTypes, "kube-apiserver's --kubelet-preferred-address-types: which node address the apiserver connects to a kubelet at")
	o.writeFlags.UintVar(&o.Kubelet.Port, "kubelet-port", o.Kubelet.Port, "kube-apiserver's --kubelet-port (deprecated there)")
	o.writeFlags.UintVar(&o.Kubelet.ReadOnlyPort, "kubelet-read-only-port", o.Kubelet.ReadOnlyPort, "kube-apiserver's --kubelet-read-only-port (deprecated there)")
	fs.AddFlagSet(o.authnFlags)
	fs.AddFlagSet(o.authzFlags)
	fs.AddFlagSet(o.writeFlags)
	if fs.Lookup("feature-gates") == nil {
		utilfeature.DefaultMutableFeatureGate.AddFlag(fs)
	}
	o.fs = fs
}

// AddReplayFlags adds kproxy's own knobs of the replay (not kube-apiserver
// flags): how hard it may read etcd, and etcd's own size limit.
func (o *Options) AddReplayFlags(fs *pflag.FlagSet) {
	o.replayFlags = pflag.NewFlagSet("replay", pflag.ContinueOnError)
	o.replayFlags.Float64Var(&o.ReplayEtcdQPS, "replay-etcd-qps", o.ReplayEtcdQPS, "the most etcd reads per second the replay makes (bursts of twice that); past it, the storage stage sheds reads and says unknown rather than load etcd")
	o.replayFlags.Float64Var(&o.ReplayAPIServerQPS, "replay-apiserver-qps", o.ReplayAPIServerQPS, "the most reads per second a write's replay makes through the apiserver (bursts of twice that); past it, the replay sheds the read and says unknown rather than load the apiserver")
	o.replayFlags.IntVar(&o.EtcdMaxRequestBytes, "etcd-max-request-bytes", o.EtcdMaxRequestBytes, "etcd's own --max-request-bytes (not a kube-apiserver flag): the largest value etcd stores, for the size check")
	fs.AddFlagSet(o.replayFlags)
}

// GivenFeatureGates are the gates set with --feature-gates: they win over
// what kproxy discovers from the apiserver.
func (o *Options) GivenFeatureGates() map[string]bool {
	out := map[string]bool{}
	if o == nil || o.fs == nil {
		return out
	}
	f := o.fs.Lookup("feature-gates")
	if f == nil || !f.Changed {
		return out
	}
	for _, kv := range strings.Split(f.Value.String(), ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok {
			out[k] = v == "true"
		}
	}
	return out
}

// Complete applies kube-apiserver's own completion (the default
// authorization mode, anonymous auth adjusted to it) and validates.
// Authentication is validated only where some of its flags were given:
// without any, the replay's authentication says it was not given them
// (NotGiven), as every stage does, instead of kproxy refusing to start
// on kube-apiserver's own required --service-account-issuer.
func (o *Options) Complete() error {
	var errs []error
	o.Authorization.Complete()
	o.Authentication.ApplyAuthorization(o.Authorization)
	if o.AuthenticationGiven() {
		errs = append(errs, o.Authentication.Validate()...)
	}
	errs = append(errs, o.Authorization.Validate()...)
	errs = append(errs, o.Admission.Validate()...)
	if o.ReplayEtcdQPS <= 0 {
		errs = append(errs, fmt.Errorf("--replay-etcd-qps=%v: give a positive rate (default %d)", o.ReplayEtcdQPS, DefaultReplayEtcdQPS))
	}
	if o.ReplayAPIServerQPS <= 0 {
		errs = append(errs, fmt.Errorf("--replay-apiserver-qps=%v: give a positive rate (default %d)", o.ReplayAPIServerQPS, DefaultReplayAPIServerQPS))
	}
	if o.EtcdMaxRequestBytes <= 0 {
		errs = append(errs, fmt.Errorf("--etcd-max-request-bytes=%d: etcd's limit is a positive number of bytes (etcd's default is %d)", o.EtcdMaxRequestBytes, DefaultEtcdMaxRequestBytes))
	}
	if len(errs) > 0 {
		return fmt.Errorf("the mirrored kube-apiserver flags are not valid (kube-apiserver's own validation: give kproxy the flags as the apiserver runs with them, or --apiserver-manifest with its static-pod manifest): %w", utilerrors.NewAggregate(errs))
	}
	return nil
}

// AuthenticationGiven reports whether any authentication flag was given:
// without them the replay cannot know how the apiserver authenticates,
// and says so instead of guessing.
func (o *Options) AuthenticationGiven() bool { return anyChanged(o.authnFlags) }

// AuthorizationGiven reports whether --authorization-mode or
// --authorization-config (or another authorization flag) was given.
func (o *Options) AuthorizationGiven() bool { return anyChanged(o.authzFlags) }

func anyChanged(fs *pflag.FlagSet) bool {
	if fs == nil {
		return false
	}
	changed := false
	fs.VisitAll(func(f *pflag.Flag) { changed = changed || f.Changed })
	return changed
}

// ClientCAFile is --client-ca-file.
func (o *Options) ClientCAFile() string {
	if o == nil || o.Authentication.ClientCert == nil {
		return ""
	}
	return o.Authentication.ClientCert.ClientCA
}

// RequestHeader are the --requestheader-* flags.
type RequestHeader struct {
	ClientCAFile        string
	AllowedNames        []string
	UsernameHeaders     []string
	UIDHeaders          []string
	GroupHeaders        []string
	ExtraHeaderPrefixes []string
}

// RequestHeader returns the --requestheader-* flags.
func (o *Options) RequestHeader() RequestHeader {
	if o == nil || o.Authentication.RequestHeader == nil {
		return RequestHeader{}
	}
	r := o.Authentication.RequestHeader
	return RequestHeader{ClientCAFile: r.ClientCAFile, AllowedNames: r.AllowedNames,
		UsernameHeaders: r.UsernameHeaders, UIDHeaders: r.UIDHeaders, GroupHeaders: r.GroupHeaders,
		ExtraHeaderPrefixes: r.ExtraHeaderPrefixes}
}

// NotGiven explains a stage that lacks the apiserver's configuration.
func NotGiven(what, flags string) error {
	return errors.New("kproxy was not given the apiserver's " + what + " flags (" + flags +
		"): pass them to kproxy serve as the apiserver has them, so the replay can know")
}

// ParseAPIServerArgs reads a kube-apiserver command line (its flags, as in
// a static-pod manifest) into o, for every mirrored flag the command line
// fs did not already set: flags given to kproxy win. Only the mirrored
// flags are read (the apiserver's --tls-cert-file is its own, not
// kproxy's). It returns the apiserver flags kproxy ignores.
func (o *Options) ParseAPIServerArgs(fs *pflag.FlagSet, args []string) (ignored []string, err error) {
	// Flags given to kproxy itself win; within the apiserver's command
	// line, the last occurrence wins, as it does for the apiserver.
	given := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { given[f.Name] = true })
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") {
			continue // the binary's name, or a value of a flag kproxy ignores
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		f := fs.Lookup(name)
		if f == nil || !o.mirrors(name) {
			ignored = append(ignored, "--"+name)
			continue
		}
		if !hasValue {
			if f.NoOptDefVal != "" {
				value = f.NoOptDefVal
			} else if i+1 < len(args) {
				i++
				value = args[i]
			}
		}
		if given[name] {
			continue
		}
		if err := fs.Set(name, value); err != nil {
			return ignored, fmt.Errorf("apiserver flag --%s=%s: %w", name, value, err)
		}
	}
	return ignored, nil
}

// mirrors reports whether name is one of the mirrored apiserver flags.
func (o *Options) mirrors(name string) bool {
	return name == "feature-gates" || (o.authnFlags != nil && o.authnFlags.Lookup(name) != nil) ||
		(o.authzFlags != nil && o.authzFlags.Lookup(name) != nil) ||
		(o.writeFlags != nil && o.writeFlags.Lookup(name) != nil) ||
		(o.replayFlags != nil && o.replayFlags.Lookup(name) != nil) // kproxy's own, given with them (tests, scripts)
}

// OptionsFromArgs is NewOptions with a kube-apiserver
// command line applied (tests, the demo).
func OptionsFromArgs(args []string) (*Options, []string, error) {
	o := NewOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	o.AddFlags(fs)
	o.AddReplayFlags(fs)
	ignored, err := o.ParseAPIServerArgs(fs, args)
	return o, ignored, err
}

// AddOtherAPIServerFlags adds every other kube-apiserver flag to fs,
// hidden, with kube-apiserver's own parsing (a boolean needs no value, a
// value may follow as the next argument), bound to a copy of its options
// that nothing reads: an apiserver's own flag list can be handed to
// kproxy as is, while a flag that is neither kproxy's nor the
// apiserver's is an error. Names fs already has (kproxy's own, the
// mirrored ones) are left alone. Which were given: GivenOtherAPIServerFlags.
func AddOtherAPIServerFlags(fs *pflag.FlagSet) {
	loadAPIServerDefaults()
	for _, set := range otherFlags.FlagSets {
		set.VisitAll(func(f *pflag.Flag) {
			if fs.Lookup(f.Name) != nil {
				return
			}
			c := *f
			c.Hidden = true
			if c.Annotations == nil {
				c.Annotations = map[string][]string{}
			}
			c.Annotations[otherAPIServerFlag] = []string{"true"}
			fs.AddFlag(&c)
		})
	}
}

// kube-apiserver's options are made once: they register global state (its
// component's feature gates) when made.
var (
	apiserverDefaultsOnce sync.Once
	otherFlags            cliflag.NamedFlagSets
	kubeletDefaults       kubeletclient.KubeletClientConfig
)

func loadAPIServerDefaults() {
	apiserverDefaultsOnce.Do(func() {
		o := apiserverapp.NewServerRunOptions()
		otherFlags, kubeletDefaults = o.Flags(), o.KubeletConfig
	})
}

// defaultKubeletConfig is kube-apiserver's default kubelet client
// configuration.
func defaultKubeletConfig() kubeletclient.KubeletClientConfig {
	loadAPIServerDefaults()
	c := kubeletDefaults
	c.PreferredAddressTypes = append([]string(nil), c.PreferredAddressTypes...)
	return c
}

const otherAPIServerFlag = "kproxy.dev/unused-kube-apiserver-flag"

// GivenOtherAPIServerFlags names the kube-apiserver flags set on fs that
// kproxy does not use.
func GivenOtherAPIServerFlags(fs *pflag.FlagSet) []string {
	var out []string
	fs.Visit(func(f *pflag.Flag) {
		if _, ok := f.Annotations[otherAPIServerFlag]; ok {
			out = append(out, "--"+f.Name)
		}
	})
	return out
}

// Args are the mirrored kube-apiserver flags that were given, as
// --name=value, in a form ParseAPIServerArgs reads back (kproxy snapshot
// keeps them).
func (o *Options) Args() []string {
	if o.fs == nil {
		return nil
	}
	var out []string
	// VisitAll and Changed: the flags are shared with the command's flag
	// set, which is where they were set.
	o.fs.VisitAll(func(f *pflag.Flag) {
		if !f.Changed || !o.mirrors(f.Name) || (o.replayFlags != nil && o.replayFlags.Lookup(f.Name) != nil) {
			return
		}
		v := f.Value.String()
		if s, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(s.GetSlice(), ",")
		}
		out = append(out, "--"+f.Name+"="+v)
	})
	return out
}
