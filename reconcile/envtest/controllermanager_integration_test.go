//go:build integration

package envtest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/opkit/opkit/reconcile/envtest"
)

// gcDeadline bounds every wait for the controller-manager to act: generous,
// as the machine may be busy; nothing asserts how fast it is.
const gcDeadline = 60 * time.Second

// holdFinalizer keeps an object that is being deleted in place until the
// test removes it, so that what happens meanwhile can be observed.
const holdFinalizer = "test.opkit.dev/hold"

// TestControllerManager runs a cluster with Options.ControllerManager and
// checks what its controllers are there for: garbage collection in the
// foreground and in the background, namespaces that finish deleting, and a
// default ServiceAccount in every namespace.
func TestControllerManager(t *testing.T) {
	c := envtest.Start(t, envtest.Options{ControllerManager: true})
	if !c.HasControllerManager() {
		t.Fatalf("HasControllerManager() = false for a cluster started with ControllerManager")
	}
	if tail := c.ControllerManagerLogTail(50); !strings.Contains(tail, "garbage") {
		t.Errorf("controller-manager log tail does not mention the garbage collector:\n%s", tail)
	}
	client := clientset(t, c)

	// A foreground delete of an owner deletes its dependents first, and the
	// owner, marked with the foregroundDeletion finalizer, only once a
	// dependent that blocks owner deletion is gone.
	t.Run("foreground deletion", func(t *testing.T) {
		ns := c.Namespace(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*gcDeadline)
		defer cancel()
		configMaps := client.CoreV1().ConfigMaps(ns)
		createOwnerAndChild(ctx, t, configMaps, holdFinalizer)

		deleteConfigMap(ctx, t, configMaps, "owner", metav1.DeletePropagationForeground)
		eventually(t, gcDeadline, "child deleted by the garbage collector", func(ctx context.Context) error {
			got, err := configMaps.Get(ctx, "child", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.DeletionTimestamp == nil {
				return fmt.Errorf("child has no deletionTimestamp")
			}
			return nil
		})
		// The held child blocks its owner's deletion.
		got, err := configMaps.Get(ctx, "owner", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("owner with a child held in deletion: %v, want it still there", err)
		}
		if got.DeletionTimestamp == nil || !slices.Contains(got.Finalizers, metav1.FinalizerDeleteDependents) {
			t.Fatalf("owner with a child held in deletion: deletionTimestamp %v, finalizers %v; want set and %s",
				got.DeletionTimestamp, got.Finalizers, metav1.FinalizerDeleteDependents)
		}

		releaseConfigMap(ctx, t, configMaps, "child")
		eventuallyGone(t, "child", func(ctx context.Context) error { return getErr(configMaps.Get(ctx, "child", metav1.GetOptions{})) })
		eventuallyGone(t, "owner", func(ctx context.Context) error { return getErr(configMaps.Get(ctx, "owner", metav1.GetOptions{})) })
	})

	// A background delete removes the owner at once; the garbage collector
	// then deletes its dependents.
	t.Run("background deletion", func(t *testing.T) {
		ns := c.Namespace(t)
		ctx, cancel := context.WithTimeout(context.Background(), 3*gcDeadline)
		defer cancel()
		configMaps := client.CoreV1().ConfigMaps(ns)
		createOwnerAndChild(ctx, t, configMaps)

		deleteConfigMap(ctx, t, configMaps, "owner", metav1.DeletePropagationBackground)
		if err := getErr(configMaps.Get(ctx, "owner", metav1.GetOptions{})); !apierrors.IsNotFound(err) {
			t.Fatalf("owner after a background delete: %v, want NotFound at once", err)
		}
		eventuallyGone(t, "child", func(ctx context.Context) error { return getErr(configMaps.Get(ctx, "child", metav1.GetOptions{})) })
	})

	// A deleted namespace goes away with its contents.
	t.Run("namespace deletion finishes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*gcDeadline)
		defer cancel()
		ns := c.Namespace(t)
		createConfigMap(ctx, t, client.CoreV1().ConfigMaps(ns), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "content"}})
		if err := client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete namespace %s: %v", ns, err)
		}
		eventuallyGone(t, "namespace "+ns, func(ctx context.Context) error {
			return getErr(client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}))
		})
	})

	// The service-account controller gives every namespace its default
	// ServiceAccount.
	t.Run("default service account", func(t *testing.T) {
		ns := c.Namespace(t)
		eventually(t, gcDeadline, "default ServiceAccount in "+ns, func(ctx context.Context) error {
			return getErr(client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}))
		})
	})
}

// TestSharedClusterHasNoControllerManager: the shared cluster is started
// without Options.ControllerManager, and says so.
func TestSharedClusterHasNoControllerManager(t *testing.T) {
	c := envtest.Shared(t)
	if c.HasControllerManager() {
		t.Fatalf("shared cluster: HasControllerManager() = true")
	}
	if tail := c.ControllerManagerLogTail(5); !strings.Contains(tail, "no kube-controller-manager") {
		t.Fatalf("shared cluster: ControllerManagerLogTail = %q", tail)
	}
}

func clientset(t testing.TB, c *envtest.Environment) *kubernetes.Clientset {
	t.Helper()
	client, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return client
}

// createOwnerAndChild creates ConfigMap "owner" and ConfigMap "child" with
// childFinalizers and a controller reference to the owner that blocks the
// owner's foreground deletion.
func createOwnerAndChild(ctx context.Context, t testing.TB, configMaps typedcorev1.ConfigMapInterface, childFinalizers ...string) {
	t.Helper()
	owner := createConfigMap(ctx, t, configMaps, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}})
	yes := true
	createConfigMap(ctx, t, configMaps, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: "child",
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion:         "v1",
			Kind:               "ConfigMap",
			Name:               owner.Name,
			UID:                owner.UID,
			Controller:         &yes,
			BlockOwnerDeletion: &yes,
		}},
		Finalizers: childFinalizers,
	}})
}

func createConfigMap(ctx context.Context, t testing.TB, configMaps typedcorev1.ConfigMapInterface, cm *corev1.ConfigMap) *corev1.ConfigMap {
	t.Helper()
	got, err := configMaps.Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ConfigMap %s: %v", cm.Name, err)
	}
	return got
}

func deleteConfigMap(ctx context.Context, t testing.TB, configMaps typedcorev1.ConfigMapInterface, name string, propagation metav1.DeletionPropagation) {
	t.Helper()
	if err := configMaps.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &propagation}); err != nil {
		t.Fatalf("delete ConfigMap %s (%s): %v", name, propagation, err)
	}
}

// releaseConfigMap removes every finalizer of ConfigMap name.
func releaseConfigMap(ctx context.Context, t testing.TB, configMaps typedcorev1.ConfigMapInterface, name string) {
	t.Helper()
	if _, err := configMaps.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("remove finalizers of ConfigMap %s: %v", name, err)
	}
}

// eventuallyGone waits until get fails with NotFound.
func eventuallyGone(t testing.TB, what string, get func(context.Context) error) {
	t.Helper()
	eventually(t, gcDeadline, what+" gone", func(ctx context.Context) error {
		err := get(ctx)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		default:
			return fmt.Errorf("still there")
		}
	})
}

// getErr drops the object of a Get.
func getErr[T any](_ T, err error) error { return err }
