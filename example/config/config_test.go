package config_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/opkit/opkit"
	demov1 "github.com/opkit/opkit/example/api/v1"
	"github.com/opkit/opkit/example/config"
	"github.com/opkit/opkit/example/operator"
	"github.com/opkit/opkit/example/reconciler"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/reconcile/reconciletest"
	"github.com/opkit/opkit/trigger"
	"github.com/opkit/opkit/trigger/brokertest"
)

func objects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	objs, err := config.Objects()
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, into any) {
	t.Helper()
	for _, u := range objs {
		if u.GetKind() == kind && u.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
				t.Fatalf("%s %s does not decode strictly: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s %s in the manifests", kind, name)
}

func TestManifestsParse(t *testing.T) {
	objs := objects(t)
	kinds := map[string]int{}
	for _, u := range objs {
		kinds[u.GetKind()]++
		if u.GetLabels()["app.kubernetes.io/name"] != "opkit-demo" {
			t.Errorf("%s %s lacks the kustomization's labels", u.GetKind(), u.GetName())
		}
	}
	for _, k := range []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
		"Role", "RoleBinding", "Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget"} {
		if kinds[k] == 0 {
			t.Errorf("no %s in the manifests", k)
		}
	}

	crd := objs[slices.IndexFunc(objs, func(u *unstructured.Unstructured) bool { return u.GetKind() == "CustomResourceDefinition" })]
	str := func(fields ...string) string { v, _, _ := unstructured.NestedString(crd.Object, fields...); return v }
	if str("spec", "group") != demov1.Group || str("spec", "names", "plural") != demov1.Plural ||
		str("spec", "names", "kind") != demov1.Kind || str("spec", "scope") != "Namespaced" {
		t.Fatalf("CRD names do not match the Go binding: %v", crd.Object["spec"])
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	if len(versions) != 1 {
		t.Fatalf("CRD has %d versions, want 1", len(versions))
	}
	v := versions[0].(map[string]any)
	if v["name"] != demov1.Version {
		t.Fatalf("CRD version %v", v["name"])
	}
	if _, ok, _ := unstructured.NestedMap(v, "subresources", "status"); !ok {
		t.Error("CRD has no status subresource")
	}
	schema, _, _ := unstructured.NestedMap(v, "schema", "openAPIV3Schema", "properties")
	field := func(m map[string]any, path ...string) any {
		x, _, _ := unstructured.NestedFieldNoCopy(m, path...)
		return x
	}
	if req := field(schema, "spec", "required"); !slices.Contains(anyStrings(req), "message") {
		t.Errorf("spec.required = %v, want message", req)
	}
	if ml := num(field(schema, "spec", "properties", "message", "maxLength")); ml != demov1.MaxMessageLength {
		t.Errorf("spec.message.maxLength = %v", ml)
	}
	rep := func(k string) float64 { return num(field(schema, "spec", "properties", "replicas", k)) }
	if rep("minimum") != 0 || rep("maximum") != demov1.MaxReplicas || rep("default") != demov1.DefaultReplicas {
		t.Errorf("spec.replicas: minimum %v maximum %v default %v", rep("minimum"), rep("maximum"), rep("default"))
	}
	for _, f := range []string{"observedGeneration", "lastReconciled", "lastTrigger", "conditions", "reconciledBy", "configMap"} {
		if field(schema, "status", "properties", f) == nil {
			t.Errorf("status.%s is not in the schema (the reconciler writes it; the API server would prune it)", f)
		}
	}
	if enum := anyStrings(field(schema, "status", "properties", "lastTrigger", "properties", "source", "enum")); !slices.Equal(enum, []string{"APIServer", "Operator"}) {
		t.Errorf("lastTrigger.source enum = %v", enum)
	}
	if cols, _ := v["additionalPrinterColumns"].([]any); len(cols) < 4 {
		t.Errorf("only %d printer columns", len(cols))
	}

	// The Deployment: two replicas, probes, requests, non-root, read-only root.
	dep := objs[slices.IndexFunc(objs, func(u *unstructured.Unstructured) bool { return u.GetKind() == "Deployment" })]
	replicas := num(dep.Object["spec"].(map[string]any)["replicas"])
	containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	runAsNonRoot, _, _ := unstructured.NestedBool(dep.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot")
	if replicas != 2 || len(containers) != 1 || !runAsNonRoot {
		t.Fatalf("deployment: replicas %v, %d containers, runAsNonRoot %v", replicas, len(containers), runAsNonRoot)
	}
	c := containers[0].(map[string]any)
	ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem")
	_, hasLive := c["livenessProbe"]
	_, hasReady := c["readinessProbe"]
	cpu, _, _ := unstructured.NestedString(c, "resources", "requests", "cpu")
	if !ro || !hasLive || !hasReady || cpu == "" {
		t.Errorf("container: readOnlyRootFilesystem %v, liveness %v, readiness %v, cpu request %q", ro, hasLive, hasReady, cpu)
	}
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	if !slices.Contains(args, "--leader-election-id="+operator.DefaultLeaderElectionID) {
		t.Errorf("deployment args %v do not name the Lease %s", args, operator.DefaultLeaderElectionID)
	}
	// The NetworkPolicy restricts the trigger port.
	np := objs[slices.IndexFunc(objs, func(u *unstructured.Unstructured) bool { return u.GetKind() == "NetworkPolicy" })]
	ingress, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	if !strings.Contains(fmt.Sprint(ingress), "port:trigger") {
		t.Errorf("NetworkPolicy ingress %v does not mention the trigger port", ingress)
	}
	if _, err := config.Sample(); err != nil {
		t.Error(err)
	}
}

// call is one API request as RBAC sees it.
type call struct {
	verb, group, resource, subresource, namespace, name string
}

func (c call) String() string {
	r := c.resource
	if c.subresource != "" {
		r += "/" + c.subresource
	}
	return fmt.Sprintf("%s %s.%s %s/%s", c.verb, r, c.group, c.namespace, c.name)
}

func callOf(a k8stesting.Action) call {
	c := call{verb: a.GetVerb(), group: a.GetResource().Group, resource: a.GetResource().Resource,
		subresource: a.GetSubresource(), namespace: a.GetNamespace()}
	switch a := a.(type) {
	case k8stesting.GetAction:
		c.name = a.GetName()
	case k8stesting.PatchAction:
		c.name = a.GetName()
	case k8stesting.DeleteAction:
		c.name = a.GetName()
	case k8stesting.UpdateAction:
		if o, ok := a.GetObject().(metav1.Object); ok {
			c.name = o.GetName()
		}
	case k8stesting.WatchAction:
		if n, ok := a.GetWatchRestrictions().Fields.RequiresExactMatch("metadata.name"); ok {
			c.name = n
		}
	case k8stesting.ListAction:
		if n, ok := a.GetListRestrictions().Fields.RequiresExactMatch("metadata.name"); ok {
			c.name = n
		}
	}
	if c.verb == "create" && c.subresource == "" {
		c.name = "" // RBAC does not see the name of a create
	}
	return c
}

// grant is a rule with the scope it applies in ("" = all namespaces).
type grant struct {
	rule      rbacv1.PolicyRule
	namespace string
	origin    string
	used      bool
}

func matches(list []string, v string) bool {
	return slices.Contains(list, v) || slices.Contains(list, "*")
}

func (g *grant) allows(c call) bool {
	res := c.resource
	if c.subresource != "" {
		res += "/" + c.subresource
	}
	if g.namespace != "" && g.namespace != c.namespace {
		return false
	}
	if !matches(g.rule.APIGroups, c.group) || !matches(g.rule.Resources, res) || !matches(g.rule.Verbs, c.verb) {
		return false
	}
	if len(g.rule.ResourceNames) > 0 && !slices.Contains(g.rule.ResourceNames, c.name) {
		return false
	}
	return true
}

// operatorGrants returns the rules bound to the operator's ServiceAccount.
func operatorGrants(t *testing.T) []*grant {
	t.Helper()
	objs := objects(t)
	isOperator := func(subjects []rbacv1.Subject) bool {
		return slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool {
			return s.Kind == "ServiceAccount" && s.Name == config.ServiceAccount && s.Namespace == config.Namespace
		})
	}
	var out []*grant
	for _, u := range objs {
		switch u.GetKind() {
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			find(t, objs, "ClusterRoleBinding", u.GetName(), &b)
			if !isOperator(b.Subjects) {
				continue
			}
			var r rbacv1.ClusterRole
			find(t, objs, "ClusterRole", b.RoleRef.Name, &r)
			for _, rule := range r.Rules {
				out = append(out, &grant{rule: rule, origin: "ClusterRole " + r.Name})
			}
		case "RoleBinding":
			var b rbacv1.RoleBinding
			find(t, objs, "RoleBinding", u.GetName(), &b)
			if !isOperator(b.Subjects) {
				continue
			}
			var rules []rbacv1.PolicyRule
			if b.RoleRef.Kind == "ClusterRole" {
				var r rbacv1.ClusterRole
				find(t, objs, "ClusterRole", b.RoleRef.Name, &r)
				rules = r.Rules
			} else {
				var r rbacv1.Role
				find(t, objs, "Role", b.RoleRef.Name, &r)
				rules = r.Rules
			}
			for _, rule := range rules {
				out = append(out, &grant{rule: rule, namespace: b.Namespace, origin: b.RoleRef.Kind + " " + b.RoleRef.Name})
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no rules are bound to the operator's ServiceAccount")
	}
	return out
}

// recorder collects calls from any number of fakes.
type recorder struct {
	mu    sync.Mutex
	calls []call
}

func (r *recorder) add(actions []k8stesting.Action) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range actions {
		r.calls = append(r.calls, callOf(a))
	}
}

// exerciseReconciler runs every path of the reconciler through reconciletest.
func exerciseReconciler(t *testing.T, rec *recorder) {
	const ns = "team-a"
	r1 := int32(2)
	e := &demov1.DemoEntity{}
	e.Namespace, e.Name, e.UID, e.Generation, e.ResourceVersion = ns, "hello", "uid-1", 1, "1"
	e.Spec.Message, e.Spec.Replicas = "hi", &r1
	h := reconciletest.New[*demov1.DemoEntity](t, demov1.Resource, e)
	events, err := reconcile.NewRecorder(reconcile.RecorderConfig{Dynamic: h.Dynamic, Controller: operator.ControllerName, Resource: demov1.Resource})
	if err != nil {
		t.Fatal(err)
	}
	r, err := reconciler.New(reconciler.Config{Dynamic: h.Dynamic, Recorder: events, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	key := opkit.KeyOf(e)
	ctx := context.Background()
	steps := []func() reconciletest.Call{
		func() reconciletest.Call { return h.ReconcileKey(ctx, r, key) }, // create
		func() reconciletest.Call { // drift: the ConfigMap is updated back
			cms := h.Dynamic.Resource(schemaCM).Namespace(ns)
			u, _ := cms.Get(ctx, "hello-demo", metav1.GetOptions{})
			_ = unstructured.SetNestedField(u.Object, "tampered", "data", "message")
			if _, err := cms.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			return h.ReconcileKey(ctx, r, key)
		},
		func() reconciletest.Call { // an external trigger
			req := h.Request(key, opkit.Modified)
			req.Sources, req.Reasons = opkit.Sources(opkit.Operator), []string{"rbac test"}
			return h.Reconcile(ctx, r, req)
		},
		func() reconciletest.Call { h.MarkDeleting(key); return h.ReconcileKey(ctx, r, key) }, // finalize
	}
	for i, step := range steps {
		c := step()
		if c.Err != nil {
			t.Fatalf("reconciler step %d: %v", i, c.Err)
		}
		rec.add(c.Actions)
	}
}

var schemaCM = corev1.SchemeGroupVersion.WithResource("configmaps")

// num reads a YAML number (decoded as float64 or int64).
func num(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int64:
		return float64(n)
	}
	return -1
}

func anyStrings(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// exerciseOperator assembles the operator exactly as the binary does
// (operator.Assemble) on fake clients and runs it in a bubble: it campaigns
// for and holds the Lease, lists and watches, reconciles, serves one HTTP
// trigger through the TokenReview/SubjectAccessReview authenticator and
// consumes one message, then shuts down and releases the Lease.
func exerciseOperator(t *testing.T, rec *recorder) {
	synctest.Test(t, func(t *testing.T) {
		h, kube := helloHarness(t)
		kube.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences, User: authnv1.UserInfo{Username: "system:serviceaccount:ci:deployer"}}
			return true, tr, nil
		})
		var sars []authzv1.ResourceAttributes
		kube.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
			sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
			sars = append(sars, *sar.Spec.ResourceAttributes)
			sar.Status.Allowed = true
			return true, sar, nil
		})
		// Another replica holds the Lease, just renewed: the operator
		// follows (it reads and watches the Lease) until the Lease
		// expires, then takes it, whoever would win a race to a free one.
		now := metav1.NewMicroTime(time.Now())
		held := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: config.Namespace, Name: operator.DefaultLeaderElectionID},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr("replica-0"), LeaseDurationSeconds: ptr[int32](15), AcquireTime: &now, RenewTime: &now}}
		if err := kube.Tracker().Add(held); err != nil {
			t.Fatal(err)
		}
		broker, reg, op, cancel, done := runOperator(t, h, kube)
		time.Sleep(5 * time.Second) // virtual: follow
		synctest.Wait()
		if op.Controller.Held() != 0 {
			t.Fatal("the operator took a Lease another replica holds")
		}
		time.Sleep(20 * time.Second) // virtual: the Lease expires; acquire it, list, watch, reconcile
		synctest.Wait()
		if op.Group().Ready() != nil {
			t.Fatalf("not ready after the Lease expired: %v", op.Group().Ready())
		}

		req := httptest.NewRequest(http.MethodPost, "/reconcile/team-a/hello?reason=rbac", nil)
		req.Header.Set("Authorization", "Bearer some-token")
		w := httptest.NewRecorder()
		op.TriggerHandler().ServeHTTP(w, req)
		if w.Code != http.StatusAccepted {
			t.Fatalf("HTTP trigger: %d %s", w.Code, w.Body)
		}
		broker.Publish([]byte(`{"namespace":"team-a","name":"hello","reason":"rbac"}`))
		time.Sleep(5 * time.Second)
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// The operator acknowledges after the reconcile, replying its outcome.
		if ev := broker.Events(); len(ev) != 2 || ev[0].Op != "Reply" || ev[1].Op != "Ack" {
			t.Fatalf("consumer settled %+v, want the outcome replied, then one ack", ev)
		}
		obj := h.Get(opkit.Key{Namespace: "team-a", Name: "hello"})
		if lt := obj.Status.LastTrigger; lt == nil || lt.Source != demov1.SourceOperator || lt.Reason != "rbac" || obj.Status.ReconciledBy != "replica-1" {
			t.Fatalf("status after the triggers = %+v", obj.Status)
		}
		// Both triggers went through a Trigger that reports its outcomes.
		if n := counterSum(t, reg, "opkit_trigger_enqueued_total"); n != 2 {
			t.Errorf("opkit_trigger_enqueued_total = %v, want 2 (one HTTP, one message)", n)
		}
		// The SubjectAccessReview asks for what the trigger ClusterRole grants.
		if len(sars) != 1 || sars[0].Verb != "create" || sars[0].Group != demov1.Group || sars[0].Resource != demov1.Plural ||
			sars[0].Subresource != "reconcile" {
			t.Fatalf("SubjectAccessReview attributes = %+v", sars)
		}
		var triggerRole rbacv1.ClusterRole
		find(t, objects(t), "ClusterRole", config.TriggerClusterRole, &triggerRole)
		g := &grant{rule: triggerRole.Rules[0]}
		if len(triggerRole.Rules) != 1 || !g.allows(call{verb: sars[0].Verb, group: sars[0].Group, resource: sars[0].Resource, subresource: sars[0].Subresource, namespace: "team-a", name: "hello"}) {
			t.Errorf("ClusterRole %s does not grant what the endpoint checks (%+v)", config.TriggerClusterRole, sars[0])
		}
		rec.add(h.Dynamic.Actions())
		rec.add(kube.Actions())
	})
}

// helloHarness is a fake API server holding team-a/hello, and a fake
// clientset.
func helloHarness(t *testing.T) (*reconciletest.Harness[*demov1.DemoEntity], *kubefake.Clientset) {
	e := &demov1.DemoEntity{}
	e.Namespace, e.Name, e.UID, e.Generation = "team-a", "hello", "uid-1", 1
	e.Spec.Message = "hi"
	return reconciletest.New[*demov1.DemoEntity](t, demov1.Resource, e), kubefake.NewClientset()
}

// exerciseShardedOperator runs the operator with --shards 2 alone: it
// takes both shards, reconciles, serves an HTTP trigger, and stops
// (deleting its member Lease). The calls go to rec.
func exerciseShardedOperator(t *testing.T, rec *recorder) {
	synctest.Test(t, func(t *testing.T) {
		h, kube := helloHarness(t)
		_, _, op, cancel, done := runOperator(t, h, kube, func(o *operator.Options) { o.Shards, o.InsecureSkipTriggerAuth = 2, true })
		time.Sleep(30 * time.Second) // virtual: count the members, take both shards, list, reconcile
		synctest.Wait()
		if err := op.Group().Ready(); err != nil || op.Controller.Held() != 2 {
			t.Fatalf("after 30s: holds %d of 2 shards, ready: %v", op.Controller.Held(), err)
		}
		w := httptest.NewRecorder()
		op.TriggerHandler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/reconcile/team-a/hello?reason=rbac", nil))
		if w.Code != http.StatusAccepted {
			t.Fatalf("HTTP trigger: %d %s", w.Code, w.Body)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if lt := h.Get(opkit.Key{Namespace: "team-a", Name: "hello"}).Status.LastTrigger; lt == nil || lt.Reason != "rbac" {
			t.Fatalf("last trigger %+v, want the HTTP trigger's", lt)
		}
		rec.add(h.Dynamic.Actions())
		rec.add(kube.Actions())
	})
}

// A broker outage does not take a replica out of its Service (the HTTP
// trigger keeps working): readiness stays, and the outage shows as the
// nats-broker component in opkit_component_ready.
func TestABrokerOutageKeepsTheReplicaReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := reconciletest.New[*demov1.DemoEntity](t, demov1.Resource)
		broker, reg, op, cancel, done := runOperator(t, h, kubefake.NewClientset())
		time.Sleep(5 * time.Second)
		synctest.Wait()
		ctrlName := op.Controller.Runnable().Name
		if got := componentReady(t, reg); got["nats-broker"] != 1 || got[ctrlName] != 1 {
			t.Fatalf("opkit_component_ready before the outage = %v", got)
		}
		broker.Fail("receive", &trigger.BrokerError{Kind: "Disconnected", Op: "receive", Err: errors.New("connection closed")})
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if err := op.Group().Ready(); err != nil {
			t.Errorf("not ready during a broker outage: %v", err)
		}
		if got := componentReady(t, reg); got["nats-broker"] != 0 || got[ctrlName] != 1 || got["nats-consumer"] != 1 {
			t.Errorf("opkit_component_ready during the outage = %v, want nats-broker 0, the rest 1", got)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// runOperator assembles the demo operator (replica-1, leader election on,
// no listeners) over h's dynamic client, kube and a fake broker, and runs
// it; cancel stops it and done returns Run's error.
func runOperator(t *testing.T, h *reconciletest.Harness[*demov1.DemoEntity], kube *kubefake.Clientset, mutate ...func(*operator.Options)) (*brokertest.Broker, *prometheus.Registry, *operator.Operator, context.CancelFunc, chan error) {
	t.Helper()
	broker := brokertest.New()
	reg := prometheus.NewRegistry()
	o := operator.Options{
		LeaderElect: true, LeaderElectionID: operator.DefaultLeaderElectionID, LeaderElectionNamespace: config.Namespace,
		Identity: "replica-1", Concurrency: 2,
		TriggerBindAddress: "0", MetricsBindAddress: "0", HealthProbeBindAddress: "0",
	}
	for _, m := range mutate {
		m(&o)
	}
	op, err := operator.Assemble(o, operator.Deps{Dynamic: h.Dynamic, Kube: kube, Broker: broker, Registry: reg, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- op.Run(ctx) }()
	return broker, reg, op, cancel, done
}

// componentReady gathers opkit_component_ready from reg by component.
func componentReady(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "opkit_component_ready" {
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// counterSum adds up every series of the counter family name in reg.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Rules that no fake can exercise, with the reason they are needed.
var neededOutsideFakes = map[string]string{
	"update demoentities/finalizers.demo.opkit.dev": "the OwnerReferencesPermissionEnforcement admission plugin checks it when the ConfigMap's owner reference sets blockOwnerDeletion",
	"create configmaps.":                            "a server-side apply that creates the object is authorized as create too (a fake records only the patch)",
	"get configmaps.":                               "Applier reads the child when the API server refuses an apply because another object controls it (a fake does not enforce one controller reference)",
}

func TestRBACCoversEveryCall(t *testing.T) {
	rec := &recorder{}
	exerciseReconciler(t, rec)
	exerciseOperator(t, rec)
	exerciseShardedOperator(t, rec)

	// Guard against an exercise that silently did nothing.
	for _, want := range []string{
		"list leases.coordination.k8s.io opkit-demo/", "delete leases.coordination.k8s.io opkit-demo/opkit-demo-leader-member-*",
		"update leases.coordination.k8s.io opkit-demo/opkit-demo-leader-1",
		"list demoentities.demo.opkit.dev /", "watch demoentities.demo.opkit.dev /",
		"update leases.coordination.k8s.io opkit-demo/opkit-demo-leader",
		"create tokenreviews.authentication.k8s.io /", "create events.events.k8s.io team-a/",
		"update demoentities/status.demo.opkit.dev team-a/hello", "patch configmaps. team-a/hello-demo",
		"watch configmaps. /", "watch leases.coordination.k8s.io opkit-demo/*",
	} {
		prefix, isPrefix := strings.CutSuffix(want, "*") // a name known only in part
		if !slices.ContainsFunc(rec.calls, func(c call) bool { return c.String() == want || isPrefix && strings.HasPrefix(c.String(), prefix) }) {
			t.Errorf("the exercise never made %q", want)
		}
	}
	grants := operatorGrants(t)
	seen := map[string]bool{}
	var missing []string
	for _, c := range rec.calls {
		ok := false
		for _, g := range grants {
			if g.allows(c) {
				g.used, ok = true, true
			}
		}
		if !ok && !seen[c.String()] {
			missing = append(missing, c.String())
		}
		seen[c.String()] = true
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not allowed by the operator's RBAC: %s", m)
	}
	// Least privilege: every rule (each verb of it) is used.
	for _, g := range grants {
		for _, verb := range g.rule.Verbs {
			for _, res := range g.rule.Resources {
				probe := strings.Join([]string{verb, res + "." + g.rule.APIGroups[0]}, " ")
				used := false
				for _, c := range rec.calls {
					one := &grant{rule: rbacv1.PolicyRule{APIGroups: g.rule.APIGroups, Resources: []string{res}, Verbs: []string{verb}, ResourceNames: g.rule.ResourceNames}, namespace: g.namespace}
					if one.allows(c) {
						used = true
						break
					}
				}
				if !used && neededOutsideFakes[probe] == "" {
					t.Errorf("%s grants %q, which the operator never uses: remove it", g.origin, probe)
				}
			}
		}
	}
	if t.Failed() {
		var all []string
		for c := range seen {
			all = append(all, c)
		}
		sort.Strings(all)
		t.Logf("calls made:\n  %s", strings.Join(all, "\n  "))
	}
}

func ptr[T any](v T) *T { return &v }

// The CRD's schema has exactly the fields of the Go type: a field added
// to DemoEntity and forgotten in the schema would be pruned by the API
// server without an error.
func TestTheCRDHasTheFieldsOfTheGoType(t *testing.T) {
	crd, err := config.FS.ReadFile("crd/demoentities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := reconciletest.CheckCRD[*demov1.DemoEntity](crd, demov1.Version); err != nil {
		t.Fatal(err)
	}
}
