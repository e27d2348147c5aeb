// Package monitoring checks manifests/monitoring: every alerting rule and
// every dashboard query parses with Prometheus's own PromQL parser, the
// PrometheusRule holds the plain rule file's groups, the kustomization
// renders, and (live_test.go) every series the rules and the dashboard select
// exists in a live scrape of bin/coredns and bin/mcs-annotator.
//
// A module of its own: github.com/prometheus/prometheus brings hundreds of
// packages (and newer versions of shared ones) that the product's go.mod
// should not carry for a test.
package monitoring

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/mcsannotations/mcsannotations/test/harness"
)

var promql = parser.NewParser(parser.Options{})

// dir is manifests/monitoring.
func dir(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "manifests", "monitoring")
}

// query is one PromQL expression and where it was written.
type query struct {
	where string
	expr  string
}

// ruleQueries parses rules.yaml as Prometheus does (rulefmt: unknown fields,
// expressions, label names and templates are checked) and returns each
// rule's expression.
func ruleQueries(t *testing.T) ([]query, *rulefmt.RuleGroups) {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(filepath.Join(dir(t), "rules.yaml"), false, model.UTF8Validation, promql, slog.Default())
	for _, err := range errs {
		t.Error(err)
	}
	if rgs == nil {
		t.FailNow()
	}
	var qs []query
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{where: "rules.yaml: " + g.Name + ": " + r.Alert + r.Record, expr: r.Expr})
		}
	}
	return qs, rgs
}

// dashboard is the part of Grafana's dashboard JSON the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
			Datasource *ds    `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

type ds struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *ds    `json:"datasource"`
	GridPos    *struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *ds    `json:"datasource"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir(t), "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	return d
}

// grafanaVar is a Grafana variable in a query: $name or ${name}.
var grafanaVar = regexp.MustCompile(`\$\{?(\w+)\}?`)

// grafanaIntervals are Grafana's built-in interval variables, with a value
// for the parser.
var grafanaIntervals = map[string]string{"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}

// expand replaces Grafana's variables so that PromQL parses the query: the
// intervals by a duration, the dashboard's own variables (used as regular
// expressions in label matchers: all their values) by ".*". An unknown
// variable is an error.
func expand(expr string, vars map[string]bool) (string, error) {
	var err error
	out := grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		name := grafanaVar.FindStringSubmatch(m)[1]
		if d, ok := grafanaIntervals[name]; ok {
			return d
		}
		if !vars[name] {
			err = fmt.Errorf("unknown variable $%s", name)
		}
		return ".*"
	})
	return out, err
}

// labelValues is a templating query label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// dashboardQueries returns every panel target's and variable's query, with
// the variables expanded, and checks the dashboard's shape: unique panel
// IDs, a position for each, every query on the dashboard's data source
// variable.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard.json: uid %q, title %q: both needed", d.UID, d.Title)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	if !vars["datasource"] {
		t.Errorf("dashboard.json: no datasource variable: every panel must pick the Prometheus it reads")
	}
	var qs []query
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("dashboard.json: variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
			continue
		}
		e, err := expand(m[1], vars)
		if err != nil {
			t.Errorf("dashboard.json: variable %s: %v", v.Name, err)
		}
		// The label must be on the series: select only those that carry it.
		sel := strings.TrimSuffix(e, "}")
		if sel == e {
			sel += "{"
		} else {
			sel += ", "
		}
		qs = append(qs, query{where: "dashboard.json: variable " + v.Name, expr: sel + m[2] + `!=""}`})
	}
	ids := map[int]string{}
	for _, p := range d.Panels {
		where := fmt.Sprintf("dashboard.json: panel %d %q", p.ID, p.Title)
		if other, ok := ids[p.ID]; ok {
			t.Errorf("%s: ID also used by %q", where, other)
		}
		ids[p.ID] = p.Title
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("%s: no gridPos", where)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", where)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("%s: datasource %+v, want uid ${datasource}", where, p.Datasource)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s target %s: datasource %+v, want uid ${datasource}", where, tg.RefID, tg.Datasource)
			}
			e, err := expand(tg.Expr, vars)
			if err != nil {
				t.Errorf("%s target %s: %v", where, tg.RefID, err)
			}
			qs = append(qs, query{where: where + " target " + tg.RefID, expr: e})
		}
	}
	return qs
}

// selector is one vector selector of a query, as label matchers (with
// __name__).
type selector struct {
	where    string
	matchers []*labels.Matcher
}

func (s selector) String() string {
	var b []string
	for _, m := range s.matchers {
		b = append(b, m.String())
	}
	return "{" + strings.Join(b, ", ") + "}"
}

// selectors parses each query and returns its vector selectors; a query that
// does not parse is an error naming where it is.
func selectors(t *testing.T, qs []query) []selector {
	t.Helper()
	var out []selector
	for _, q := range qs {
		expr, err := promql.ParseExpr(q.expr)
		if err != nil {
			t.Errorf("%s: %q does not parse: %v", q.where, q.expr, err)
			continue
		}
		for _, ms := range parser.ExtractSelectors(expr) {
			out = append(out, selector{where: q.where, matchers: ms})
		}
	}
	return out
}

// allQueries is every query of the rules and the dashboard.
func allQueries(t *testing.T) []query {
	qs, _ := ruleQueries(t)
	return append(qs, dashboardQueries(t)...)
}

func TestRulesParse(t *testing.T) {
	qs, rgs := ruleQueries(t)
	if len(qs) == 0 {
		t.Fatal("rules.yaml: no rules")
	}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary annotation", r.Alert)
			}
		}
	}
	if sels := selectors(t, qs); len(sels) < len(qs) {
		t.Errorf("%d selectors in %d rules: each rule reads at least one series", len(sels), len(qs))
	}
}

// The PrometheusRule carries the plain rule file's groups unchanged.
func TestPrometheusRuleMatchesRules(t *testing.T) {
	read := func(name string) map[string]any {
		b, err := os.ReadFile(filepath.Join(dir(t), name))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return m
	}
	plain := read("rules.yaml")["groups"]
	cr := read("prometheusrule.yaml")
	spec, _ := cr["spec"].(map[string]any)
	if cr["kind"] != "PrometheusRule" || spec == nil {
		t.Fatalf("prometheusrule.yaml: kind %v, spec %v", cr["kind"], spec)
	}
	if !reflect.DeepEqual(plain, spec["groups"]) {
		t.Errorf("prometheusrule.yaml's spec.groups differ from rules.yaml's groups: edit both alike")
	}
}

func TestDashboardParses(t *testing.T) {
	qs := dashboardQueries(t)
	if len(qs) == 0 {
		t.Fatal("dashboard.json: no queries")
	}
	selectors(t, qs)
}

// render builds manifests/monitoring with kustomize, as `kubectl apply -k`
// does.
func render(t *testing.T) [][]byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir(t))
	if err != nil {
		t.Fatalf("kustomize build manifests/monitoring: %v", err)
	}
	var out [][]byte
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestKustomization(t *testing.T) {
	dash, err := os.ReadFile(filepath.Join(dir(t), "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, b := range render(t) {
		var o struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal(b, &o); err != nil {
			t.Fatal(err)
		}
		kinds[o.Kind]++
		if o.Kind == "ConfigMap" {
			if o.Data["mcsannotations.json"] != string(dash) {
				t.Errorf("ConfigMap %s: mcsannotations.json is not dashboard.json", o.Metadata.Name)
			}
			if o.Metadata.Labels["grafana_dashboard"] != "1" {
				t.Errorf("ConfigMap %s: labels %v: Grafana's sidecar loads those labelled grafana_dashboard", o.Metadata.Name, o.Metadata.Labels)
			}
		}
	}
	if want := map[string]int{"ConfigMap": 1, "PrometheusRule": 1, "PodMonitor": 1}; !reflect.DeepEqual(kinds, want) {
		t.Errorf("kustomize build: %v, want %v", kinds, want)
	}
}
