package opkit_test

import (
	"context"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/opkit/opkit"
	"github.com/opkit/opkit/leader"
	"github.com/opkit/opkit/reconcile"
	"github.com/opkit/opkit/trigger"
)

type Widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Size int `json:"size"`
	} `json:"spec"`
}

var widgets = opkit.Resource{
	GroupVersionResource: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"},
	Kind:                 "Widget",
	Namespaced:           true,
}

// The minimal operator of the package documentation, compiled (not run: it
// needs a cluster).
func Example_minimalOperator() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name:     "example.com/widgets",
		Resource: widgets,
		Dynamic:  dynamic.NewForConfigOrDie(cfg),
		Reconciler: reconcile.Func[*Widget](func(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
			slog.InfoContext(ctx, "reconcile", "key", req.Key, "type", req.Type, "sources", req.Sources)
			return reconcile.Done(), nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := ctrl.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// reconcileWidget is the operator's reconcile: here it only logs.
func reconcileWidget(ctx context.Context, req reconcile.Request[*Widget]) (reconcile.Result, error) {
	slog.InfoContext(ctx, "reconcile", "key", req.Key, "type", req.Type, "sources", req.Sources)
	return reconcile.Done(), nil
}

// A whole operator, as the README's "Using it" shows it: a controller
// with leader election, the HTTP trigger endpoint (TokenReview and
// SubjectAccessReview; a follower forwards to the leader on its own) and
// health endpoints, stopped in the right order on SIGTERM. Compiled, not
// run: it needs a cluster.
func Example_operator() {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		log.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	ctrl, err := reconcile.NewController(reconcile.Config[*Widget]{
		Name: "example.com/widgets", Resource: widgets, RESTConfig: cfg,
		Reconciler: reconcile.Func[*Widget](reconcileWidget),
		Leader:     &leader.Config{Client: kube, Namespace: "ops", Name: "widgets"},
	})
	if err != nil {
		log.Fatal(err)
	}
	op, err := reconcile.NewOperator(reconcile.OperatorConfig{
		Controllers: []reconcile.Part{ctrl},
		Triggers:    &reconcile.TriggerEndpoint{Handler: trigger.HandlerConfig{Reviews: kube}}, // :8080
		HealthAddr:  ":8081",
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := op.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
