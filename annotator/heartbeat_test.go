package annotator

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/mcsannotations/mcsannotations/annotation"
)

// heartbeat reads the heartbeat Lease and checks that its heartbeat
// verifies with pub and names cluster; it returns the heartbeat's time.
func (f *fixture) heartbeat(pub []byte, cluster string) (int64, error) {
	l, err := f.client.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Get(f.t.Context(), annotation.HeartbeatLeaseName, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	hb, rej, ok := annotation.VerifyHeartbeat(pub, l.Annotations[annotation.HeartbeatSignatureAnnotation], cluster, l.Annotations[annotation.HeartbeatAnnotation])
	if !ok {
		return 0, fmt.Errorf("heartbeat %q: %v", l.Annotations[annotation.HeartbeatAnnotation], rej)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != cluster || l.Spec.RenewTime == nil {
		return 0, fmt.Errorf("Lease spec %+v", l.Spec)
	}
	return hb.Time, nil
}

// With --sign-endpoints the annotator keeps a heartbeat Lease whose
// heartbeat its key signed, and writes it again every interval with a later
// time; a write that fails is counted and tried again.
func TestHeartbeatLease(t *testing.T) {
	pub, cfg := endpointKey(t)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	var failing atomic.Bool
	deny := func(c *fake.Clientset) {
		c.PrependReactor("patch", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if failing.Load() {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "leases"}, annotation.HeartbeatLeaseName, errors.New("no patch"))
			}
			return false, nil, nil
		})
	}
	f := startHooked(t, cfg, deny, false, nil)
	var first int64
	f.eventually("a heartbeat", func() (err error) {
		first, err = f.heartbeat(pub, "edge-a")
		return err
	})
	f.eventually("a later heartbeat", func() error {
		t, err := f.heartbeat(pub, "edge-a")
		if err == nil && t <= first {
			err = fmt.Errorf("heartbeat of %d, not after %d", t, first)
		}
		return err
	})
	failing.Store(true)
	f.eventually("a failed write counted", func() error {
		if testutil.ToFloat64(f.m.HeartbeatWrites.WithLabelValues("error")) == 0 {
			return errors.New("none")
		}
		return nil
	})
	held, _ := f.heartbeat(pub, "edge-a")
	failing.Store(false)
	f.eventually("written again", func() error {
		t, err := f.heartbeat(pub, "edge-a")
		if err == nil && t <= held {
			err = fmt.Errorf("heartbeat of %d, not after %d", t, held)
		}
		return err
	})
	f.eventually("the writes counted", func() error {
		if n := testutil.ToFloat64(f.m.HeartbeatWrites.WithLabelValues("ok")); n < 3 {
			return fmt.Errorf("%v writes counted, want at least 3", n)
		}
		return nil
	})
}

// Without --sign-endpoints there is no heartbeat.
func TestNoHeartbeatWithoutEndpoints(t *testing.T) {
	_, cfg := endpointKey(t)
	cfg.SignEndpoints = false
	cfg.HeartbeatInterval = 10 * time.Millisecond
	f := startWith(t, cfg, false, nil)
	time.Sleep(200 * time.Millisecond)
	if _, err := f.client.CoordinationV1().Leases(annotation.HeartbeatLeaseNamespace).Get(t.Context(), annotation.HeartbeatLeaseName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("heartbeat Lease without --sign-endpoints: %v", err)
	}
}
