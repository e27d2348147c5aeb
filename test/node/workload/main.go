// Command workload is the test Pods' program in the real-node tests
// (test/node): static, no libc, so that it runs from an image built without a
// base image (tools/image build -test-images).
//
//	workload serve [-listen :8080]   HTTP echo: "cluster=C pod=P" from the
//	                                 environment (CLUSTER, POD_NAME)
//	workload lookup NAME             resolve NAME with Go's own resolver, which
//	                                 reads the Pod's /etc/resolv.conf (search
//	                                 list, ndots) like libc: one address a line
//	workload get URL                 one HTTP GET, the body on stdout
//	workload probe NAME DURATION     resolve NAME every 100 ms for DURATION
//	                                 (each lookup bounded by 2 s), then print
//	                                 "ok=N fail=M" and each failure's error
//
// lookup and get run inside a Pod through `kubectl exec`, so what they see is
// what any process of the Pod sees: the kubelet-written resolv.conf, the
// kube-dns Service through kube-proxy, the Pod's own source address.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: workload serve|lookup NAME|get URL")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "lookup":
		err = lookup(os.Args[2:])
	case "get":
		err = get(os.Args[2:])
	case "probe":
		err = probe(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address to serve HTTP on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	reply := fmt.Sprintf("cluster=%s pod=%s\n", os.Getenv("CLUSTER"), os.Getenv("POD_NAME"))
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// The client's address as this Pod sees it: no SNAT on the path
		// shows the caller's Pod IP here.
		w.Header().Set("X-Remote-Addr", r.RemoteAddr)
		io.WriteString(w, reply)
	})
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}

func lookup(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("lookup wants one name")
	}
	r := &net.Resolver{PreferGo: true}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := r.LookupHost(ctx, args[0])
	if err != nil {
		return err
	}
	for _, a := range addrs {
		fmt.Println(a)
	}
	return nil
}

func get(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("get wants one URL")
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(args[0])
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", args[0], resp.Status)
	}
	fmt.Printf("%sremote=%s\n", body, resp.Header.Get("X-Remote-Addr"))
	return nil
}

func probe(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("probe wants a name and a duration")
	}
	d, err := time.ParseDuration(args[1])
	if err != nil {
		return err
	}
	r := &net.Resolver{PreferGo: true}
	var ok, fail int
	var errs []string
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := r.LookupHost(ctx, args[0])
		cancel()
		if err != nil {
			fail++
			errs = append(errs, time.Now().UTC().Format(time.RFC3339Nano)+" "+err.Error())
		} else {
			ok++
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("ok=%d fail=%d\n", ok, fail)
	for _, e := range errs {
		fmt.Println(e)
	}
	return nil
}
