package localcluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KproxyClusterRole is what kproxy's own identity needs (the README shows
// the same rules): impersonate verified certificate callers, ask
// SubjectAccessReviews for their Impersonate-* headers, and read the state
// the replay models.
var KproxyClusterRole = &rbacv1.ClusterRole{
	ObjectMeta: metav1.ObjectMeta{Name: "kproxy"},
	Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"users", "groups", "serviceaccounts"}, Verbs: []string{"impersonate"}},
		// uids and userextras/<key>: RBAC has no "userextras/*" wildcard
		// (only "*/sub"), so every extra key needs "*" here.
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}},
		// The apiserver's version and feature gates; the paths it serves
		// (its index), its health checks and its OpenAPI index, which the
		// replay of non-resource requests reads.
		{NonResourceURLs: []string{"/version", "/metrics", "/", "/healthz", "/healthz/*", "/livez", "/livez/*", "/readyz", "/readyz/*", "/openapi/v3", "/openapi/v2"}, Verbs: []string{"get"}},
	},
}

// GrantKproxy binds KproxyClusterRole to the user kproxy runs as.
func GrantKproxy(ctx context.Context, cs kubernetes.Interface, userName string) error {
	if err := Apply(ctx, cs, KproxyClusterRole.DeepCopy()); err != nil {
		return err
	}
	return Apply(ctx, cs, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kproxy"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kproxy"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: userName}},
	})
}

// Apply creates an RBAC object, replacing one of the same name.
func Apply(ctx context.Context, cs kubernetes.Interface, obj any) error {
	var err error
	switch o := obj.(type) {
	case *rbacv1.ClusterRole:
		_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.ClusterRoleBinding:
		_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().ClusterRoleBindings().Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.Role:
		_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().Roles(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	case *rbacv1.RoleBinding:
		_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
		}
	default:
		return fmt.Errorf("localcluster.Apply: unsupported %T", obj)
	}
	return err
}

// GrantDevs gives group "devs" read access to pods and configmaps and the
// right to create configmaps in namespace ns: the demo's and tests'
// ordinary users.
func GrantDevs(ctx context.Context, cs kubernetes.Interface, ns string) error {
	if err := Apply(ctx, cs, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "devs", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "configmaps"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}},
		},
	}); err != nil {
		return err
	}
	return Apply(ctx, cs, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "devs", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "devs"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "devs"}},
	})
}

// EnsureDefaultServiceAccount creates namespace ns's "default"
// ServiceAccount, which the ServiceAccount admission plugin requires for
// pods and which kube-controller-manager (not run here) would create.
func EnsureDefaultServiceAccount(ctx context.Context, cs kubernetes.Interface, ns string) error {
	_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
