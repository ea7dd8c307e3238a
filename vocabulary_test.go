package opkit_test

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/opkit/opkit"
)

func TestKeyString(t *testing.T) {
	for _, tc := range []struct {
		key  opkit.Key
		want string
	}{
		{opkit.Key{Namespace: "ns", Name: "a"}, "ns/a"},
		{opkit.Key{Name: "cluster-wide"}, "cluster-wide"},
	} {
		if got := tc.key.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.key, got, tc.want)
		}
	}
}

func TestKeyOf(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}}
	if got, want := opkit.KeyOf(cm), (opkit.Key{Namespace: "ns", Name: "a"}); got != want {
		t.Fatalf("KeyOf = %v, want %v", got, want)
	}
}

func TestTypeAndSourceZeroValuesAreInvalid(t *testing.T) {
	var typ opkit.Type
	var src opkit.Source
	if typ.Valid() || src.Valid() {
		t.Fatal("zero Type/Source must be invalid so a forgotten field is caught")
	}
	for _, tc := range []struct {
		valid bool
		str   string
		want  string
	}{
		{opkit.Added.Valid(), opkit.Added.String(), "Added"},
		{opkit.Modified.Valid(), opkit.Modified.String(), "Modified"},
		{opkit.Deleted.Valid(), opkit.Deleted.String(), "Deleted"},
		{opkit.APIServer.Valid(), opkit.APIServer.String(), "APIServer"},
		{opkit.Operator.Valid(), opkit.Operator.String(), "Operator"},
	} {
		if !tc.valid || tc.str != tc.want {
			t.Errorf("got valid=%v %q, want valid %q", tc.valid, tc.str, tc.want)
		}
	}
	if s := opkit.Type(9).String(); s != "Type(9)" {
		t.Errorf("invalid Type prints %q", s)
	}
	if s := opkit.Source(0).String(); s != "Source(0)" {
		t.Errorf("invalid Source prints %q", s)
	}
}

func TestResourceValidate(t *testing.T) {
	ok := opkit.Resource{GroupVersionResource: schema.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"}, Kind: "Thing"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid resource: %v", err)
	}
	if gvk := ok.GroupVersionKind(); gvk != (schema.GroupVersionKind{Group: "g", Version: "v1", Kind: "Thing"}) {
		t.Fatalf("GroupVersionKind = %v", gvk)
	}
	for _, tc := range []struct {
		name string
		mut  func(*opkit.Resource)
		want string
	}{
		{"no version", func(r *opkit.Resource) { r.Version = "" }, "no version"},
		{"no resource", func(r *opkit.Resource) { r.Resource = "" }, "no resource"},
		{"no kind", func(r *opkit.Resource) { r.Kind = "" }, "no kind"},
	} {
		r := ok
		tc.mut(&r)
		err := r.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// Cause.Merge is a join: the same causes merged in any order, grouped in
// any way, repeated or not, give the same cause.
func TestCauseMergeIsAJoin(t *testing.T) {
	cm := func(rv string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: rv}}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	reasons := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"}
	random := func() opkit.Cause[*corev1.ConfigMap] {
		var c opkit.Cause[*corev1.ConfigMap]
		if rng.IntN(3) > 0 {
			c.Object = cm(strconv.Itoa(rng.IntN(120))) // 9 and 10 and 100: lengths differ
		}
		c.Sources = opkit.Sources(rng.IntN(4))
		var rs []string
		for range rng.IntN(5) {
			rs = append(rs, reasons[rng.IntN(len(reasons))])
		}
		c.Reasons = opkit.ReasonsOf(rs...)
		c.Added, c.Teardown, c.Retries = rng.IntN(2) == 0, rng.IntN(4) == 0, rng.IntN(3)
		// Related is sorted and distinct, as the related watchers emit it.
		for _, r := range []string{"configmaps", "deployments.apps", "services"} {
			if rng.IntN(3) == 0 {
				c.Related = append(c.Related, r)
			}
		}
		c.Ticket = uint64(rng.IntN(4))
		return c
	}
	merge := func(cs ...opkit.Cause[*corev1.ConfigMap]) opkit.Cause[*corev1.ConfigMap] {
		out := cs[0]
		for _, c := range cs[1:] {
			out.Merge(c)
		}
		return out
	}
	same := func(a, b opkit.Cause[*corev1.ConfigMap]) bool {
		rv := func(c opkit.Cause[*corev1.ConfigMap]) string {
			if c.Object == nil {
				return "none"
			}
			return c.Object.ResourceVersion
		}
		return rv(a) == rv(b) && a.Sources == b.Sources && slices.Equal(a.Reasons, b.Reasons) &&
			a.Added == b.Added && a.Teardown == b.Teardown && a.Retries == b.Retries &&
			slices.Equal(a.Related, b.Related) && a.Ticket == b.Ticket
	}
	for range 2000 {
		a, b, c := random(), random(), random()
		switch {
		case !same(merge(a, b), merge(b, a)):
			t.Fatalf("not commutative: %+v, %+v", a, b)
		case !same(merge(merge(a, b), c), merge(a, merge(b, c))):
			t.Fatalf("not associative: %+v, %+v, %+v", a, b, c)
		case !same(merge(a, a), a):
			t.Fatalf("not idempotent: %+v", a)
		}
		all := merge(a, b, c)
		if len(all.Reasons) > opkit.MaxReasons || !slices.IsSorted(all.Reasons) {
			t.Fatalf("reasons %q: want at most %d, sorted", all.Reasons, opkit.MaxReasons)
		}
		if !slices.IsSorted(all.Related) || len(slices.Compact(slices.Clone(all.Related))) != len(all.Related) {
			t.Fatalf("related %q: want sorted and distinct", all.Related)
		}
		if all.Ticket != max(a.Ticket, b.Ticket, c.Ticket) {
			t.Fatalf("ticket %d, want the highest of %d, %d, %d", all.Ticket, a.Ticket, b.Ticket, c.Ticket)
		}
	}
	// The newest object by resourceVersion wins, numerically.
	x := opkit.Cause[*corev1.ConfigMap]{Object: cm("99")}
	x.Merge(opkit.Cause[*corev1.ConfigMap]{Object: cm("100")})
	if x.Object.ResourceVersion != "100" {
		t.Fatalf("merged object at %s, want 100", x.Object.ResourceVersion)
	}
}

func TestSourcesAndReasons(t *testing.T) {
	both := opkit.Sources(opkit.APIServer) | opkit.Sources(opkit.Operator)
	if !both.Has(opkit.APIServer) || !both.Has(opkit.Operator) || both.String() != "APIServer|Operator" || opkit.Sources(0).String() != "none" {
		t.Fatalf("sources %v", both)
	}
	if got := opkit.ReasonsOf("b", "", "a", "b"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("ReasonsOf = %q, want [a b]", got)
	}
	if got := opkit.ReasonsOf(""); got != nil {
		t.Fatalf("ReasonsOf(\"\") = %q, want nil", got)
	}
	many := opkit.ReasonsOf("9", "8", "7", "6", "5", "4", "3", "2", "1", "0")
	if !slices.Equal(many, []string{"0", "1", "2", "3", "4", "5", "6", "7"}) {
		t.Fatalf("ReasonsOf(10 reasons) = %q, want the 8 that sort first", many)
	}
}
