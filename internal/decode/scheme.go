package decode

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1beta1 "k8s.io/apimachinery/pkg/apis/meta/v1beta1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// payloadScheme knows every built-in kind (client-go's scheme) and the
// meta.k8s.io kinds the apiserver answers with when asked for another
// shape (Accept: ...;as=Table;v=v1;g=meta.k8s.io, as=PartialObjectMetadata),
// so those decode to typed objects too. It is kproxy's own scheme: the
// shared client-go one is left alone.
var payloadScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(metav1.AddMetaToScheme(s))
	utilruntime.Must(metav1beta1.AddMetaToScheme(s))
	return s
}()
