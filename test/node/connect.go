package node

import "fmt"

// ConnectObjects are one cluster's objects of the Connectivity test, in
// namespace connect: Service conn, selecting Pod conn-<cluster> (the
// workload's HTTP echo on 8080), with port http (80) and, when alt is set,
// port alt (81) as well, both to the Pod's 8080. It is not exported: the
// test exports it with a ServiceExport (ConnectExport).
func ConnectObjects(cluster string, alt bool) string {
	ports := `  - name: http
    port: 80
    targetPort: 8080`
	if alt {
		ports += `
  - name: alt
    port: 81
    targetPort: 8080`
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: connect
---
apiVersion: v1
kind: Service
metadata:
  name: conn
  namespace: connect
spec:
  selector:
    app: conn
  ports:
%s
---
%s
`, ports, workloadYAML("connect", "conn-"+cluster, "conn", cluster))
}

// ConnectExport is the ServiceExport of Service connect/conn.
const ConnectExport = `apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata:
  name: conn
  namespace: connect
`
