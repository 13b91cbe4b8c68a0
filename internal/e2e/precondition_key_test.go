package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kproxy/kproxy/internal/record"
)

// TestPreconditionMessage: an update naming a uid the object no longer
// has (kubectl replace -f after replace --force) is refused 409, the
// apiserver's etcd3 store naming the object's etcd key
// (/registry/configmaps/...); the replay, a dry run, checked it against
// the registry's key (/configmaps/...) and predicted the status right
// and the message not (found by a probe). A dry run of the same update
// names the registry's key in both.
func TestPreconditionMessage(t *testing.T) {
	send := adminSender(t)
	name := fmt.Sprintf("precondition-%d", time.Now().UnixNano())
	path := "/api/v1/namespaces/" + testNS + "/configmaps/"
	create := request{method: "POST", path: path, body: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `"}}`}
	send(create, 201)
	send(request{method: "DELETE", path: path + name}, 200)
	send(create, 201)
	stale := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + name + `","uid":"00000000-0000-0000-0000-000000000001"},"data":{"k":"v"}}`
	for _, q := range []string{"", "?dryRun=All"} {
		rec := send(request{method: "PUT", path: path + name + q, body: stale}, 409)
		p, a := rec.Predicted, rec.Actual
		if p.Status != 409 || p.Message != a.Message {
			t.Errorf("PUT%s with a stale uid: predicted %d at %s %q, the apiserver answered %d %q", q, p.Status, p.Stage, p.Message, a.Status, a.Message)
		}
		if p.Stage != record.StageStorage || !strings.Contains(a.Message, "Key: /") {
			t.Errorf("PUT%s with a stale uid: predicted at %s, the apiserver's message %q (want storage, naming a key)", q, p.Stage, a.Message)
		}
	}
}
