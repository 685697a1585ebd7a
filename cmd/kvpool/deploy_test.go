package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/pool"
)

// manifests is every object under deploy/kubernetes, decoded strictly
// into its Kubernetes API type: a field the API does not have, or one
// given twice, fails the decode.
type manifests struct {
	namespace string // the kustomization's
	objects   map[string]any
}

func (m *manifests) get(t *testing.T, kind, name string) any {
	t.Helper()
	o, ok := m.objects[kind+"/"+name]
	if !ok {
		t.Fatalf("deploy/kubernetes has no %s %s", kind, name)
	}
	return o
}

// kustomization is the part of kustomize's file this directory uses
// (kustomize's own types are not a module worth depending on).
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
}

// manifestKinds makes the API type of each kind the manifests use.
var manifestKinds = map[string]func() metav1.Object{
	"v1 Namespace":                        func() metav1.Object { return &corev1.Namespace{} },
	"v1 ConfigMap":                        func() metav1.Object { return &corev1.ConfigMap{} },
	"v1 Service":                          func() metav1.Object { return &corev1.Service{} },
	"v1 Pod":                              func() metav1.Object { return &corev1.Pod{} },
	"apps/v1 DaemonSet":                   func() metav1.Object { return &appsv1.DaemonSet{} },
	"apps/v1 StatefulSet":                 func() metav1.Object { return &appsv1.StatefulSet{} },
	"policy/v1 PodDisruptionBudget":       func() metav1.Object { return &policyv1.PodDisruptionBudget{} },
	"monitoring.coreos.com/v1 PodMonitor": func() metav1.Object { return &monitoringv1.PodMonitor{} },
}

func loadManifests(t *testing.T, dir string) *manifests {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("kustomization.yaml is %s %s", k.APIVersion, k.Kind)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var want []string
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" {
			want = append(want, base)
		}
	}
	if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, want) {
		t.Fatalf("kustomization.yaml lists %v; the directory holds %v", got, want)
	}
	m := &manifests{namespace: k.Namespace, objects: map[string]any{}}
	for _, f := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			newObj, ok := manifestKinds[tm.APIVersion+" "+tm.Kind]
			if !ok {
				t.Fatalf("%s document %d: %s %s is not a kind this test knows: add it", f, i, tm.APIVersion, tm.Kind)
			}
			obj := newObj()
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i, tm.Kind, err)
			}
			if tm.Kind != "Namespace" && obj.GetNamespace() != k.Namespace {
				t.Errorf("%s %s is in namespace %q, the kustomization's is %q", tm.Kind, obj.GetName(), obj.GetNamespace(), k.Namespace)
			}
			key := tm.Kind + "/" + obj.GetName()
			if _, dup := m.objects[key]; dup {
				t.Fatalf("%s is defined twice", key)
			}
			m.objects[key] = obj
		}
	}
	m.get(t, "Namespace", k.Namespace)
	return m
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// selects fails unless selector picks pods labelled podLabels.
func selects(t *testing.T, what string, selector *metav1.LabelSelector, podLabels map[string]string) {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil || s.Empty() || !s.Matches(labels.Set(podLabels)) {
		t.Errorf("%s: selector %v does not select the pods labelled %v (%v)", what, selector, podLabels, err)
	}
}

// expand does what the kubelet does to $(VAR) in args and env values,
// with the downward API's fields set to the values given.
func expand(t *testing.T, c corev1.Container, fields map[string]string) (args []string, env map[string]string) {
	t.Helper()
	env = map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	sub := func(s string) string {
		return ref.ReplaceAllStringFunc(s, func(m string) string {
			if v, ok := env[m[2:len(m)-1]]; ok {
				return v
			}
			t.Errorf("container %s: %s names no variable defined before it", c.Name, m)
			return m
		})
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = sub(e.Value)
		case e.ValueFrom.FieldRef != nil:
			v, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("container %s: env %s reads %s, which this test does not fill", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		default:
			env[e.Name] = "from-" + e.Name
		}
	}
	for _, a := range c.Args {
		args = append(args, sub(a))
	}
	return args, env
}

// mountOf is the volume and mount under which path lies in c.
func mountOf(t *testing.T, spec corev1.PodSpec, c corev1.Container, p string) (corev1.Volume, corev1.VolumeMount) {
	t.Helper()
	var best corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if (p == m.MountPath || strings.HasPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")) && len(m.MountPath) > len(best.MountPath) {
			best = m
		}
	}
	if best.Name == "" {
		t.Fatalf("container %s: %s lies under no volume mount", c.Name, p)
	}
	for _, v := range spec.Volumes {
		if v.Name == best.Name {
			return v, best
		}
	}
	t.Fatalf("container %s: mount %s names no volume %q", c.Name, best.MountPath, best.Name)
	return corev1.Volume{}, best
}

func containerPort(t *testing.T, c corev1.Container, name string) corev1.ContainerPort {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return corev1.ContainerPort{}
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(p)
	if err != nil || err2 != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return int32(n)
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

// TestKubernetesManifests decodes every manifest an operator applies
// strictly into the Kubernetes API types, then checks what can rot
// against this binary: the daemon's args and node.yaml run through
// kvpool node serve --check-config (every flag and key must exist and
// every value be valid), its ports, probes, memory and mounts agree with
// the settings that would run, the probes answer on a real daemon, and
// selectors, Services and the etcd members agree with each other.
func TestKubernetesManifests(t *testing.T) {
	m := loadManifests(t, "../../deploy/kubernetes")
	ds := m.get(t, "DaemonSet", "kvpool").(*appsv1.DaemonSet)
	pod := ds.Spec.Template
	selects(t, "DaemonSet kvpool", ds.Spec.Selector, pod.Labels)
	c := container(t, pod.Spec, "kvpool")
	fields := map[string]string{"spec.nodeName": "gpu-node-1", "status.hostIP": "10.0.0.11", "metadata.name": "kvpool-x1y2z"}
	args, _ := expand(t, c, fields)
	if !slices.Equal(c.Command, []string{"kvpool"}) || len(args) < 2 || args[0] != "node" || args[1] != "serve" {
		t.Fatalf("the daemon runs %v %v, want kvpool node serve", c.Command, args)
	}

	// node.yaml, from the ConfigMap mounted where --config points.
	var configPath string
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = v
			vol, mount := mountOf(t, pod.Spec, c, v)
			if vol.ConfigMap == nil || mount.SubPath == "" || path.Join(mount.MountPath) != v {
				t.Fatalf("--config %s is not a ConfigMap key mounted with subPath (volume %+v, mount %+v)", v, vol, mount)
			}
			cm := m.get(t, "ConfigMap", vol.ConfigMap.Name).(*corev1.ConfigMap)
			doc, ok := cm.Data[mount.SubPath]
			if !ok {
				t.Fatalf("ConfigMap %s has no key %q", cm.Name, mount.SubPath)
			}
			local := filepath.Join(t.TempDir(), "node.yaml")
			os.WriteFile(local, []byte(doc), 0o600)
			args[i] = "--config=" + local
		}
	}
	if configPath == "" {
		t.Fatal("the daemon's args give no --config=PATH")
	}
	var s checkedSettings
	decode(t, mustOK(t, kv(t, nil, append(args, "--check-config")...)), &s)
	if s.NodeID != "gpu-node-1" || s.Advertise != "10.0.0.11:7070" || s.Standalone || len(s.EtcdEndpoints) == 0 {
		t.Errorf("settings that would run: %+v", s)
	}
	if !s.Secured {
		t.Error("the daemon would listen beyond loopback with no credentials")
	}
	// A deleted pod drains first, and the kubelet waits long enough for it
	// (and for the shutdown after it).
	if grace := pod.Spec.TerminationGracePeriodSeconds; !s.DrainOnStop || grace == nil || s.DrainBudgetSeconds+pool.ShutdownGrace.Seconds()+10 > float64(*grace) {
		t.Errorf("drain_on_stop %v with a %v s budget: the pod's termination grace must cover it, the shutdown and 10 s more", s.DrainOnStop, s.DrainBudgetSeconds)
	}

	// Ports and probes.
	if !pod.Spec.HostNetwork {
		t.Error("the daemon should use host networking: peers and engines reach it at the node's address")
	}
	for name, want := range map[string]int32{"kvpool": portOf(t, s.Listen), "metrics": portOf(t, s.MetricsListen), "gossip": portOf(t, s.GossipListen), "gossip-udp": portOf(t, s.GossipListen)} {
		p := containerPort(t, c, name)
		if p.ContainerPort != want || p.HostPort != want {
			t.Errorf("port %s: container %d, host %d; the daemon listens on %d", name, p.ContainerPort, p.HostPort, want)
		}
	}
	if p := containerPort(t, c, "gossip-udp"); p.Protocol != corev1.ProtocolUDP {
		t.Errorf("gossip needs UDP too, got %s", p.Protocol)
	}
	if portOf(t, s.Advertise) != portOf(t, s.Listen) {
		t.Errorf("--advertise %s is not the port the daemon listens on (%s)", s.Advertise, s.Listen)
	}
	probes := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe}
	daemon := serve(t, "--capacity", "16MiB", "--standalone")
	for kind, p := range probes {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an HTTP GET", kind)
			continue
		}
		if p.HTTPGet.Port.StrVal != "metrics" && p.HTTPGet.Port.IntValue() != int(portOf(t, s.MetricsListen)) {
			t.Errorf("%s probe goes to port %s, not the metrics listener", kind, p.HTTPGet.Port.String())
		}
		resp, err := http.Get("http://" + daemon.metrics + p.HTTPGet.Path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s probe %s: a ready daemon answers %s", kind, p.HTTPGet.Path, resp.Status)
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probes %s, want /readyz (healthz says alive, not ready)", c.ReadinessProbe.HTTPGet.Path)
	}

	// Memory: the arena is charged to the container.
	limit, request := c.Resources.Limits[corev1.ResourceMemory], c.Resources.Requests[corev1.ResourceMemory]
	if limit.Value() < s.CapacityBytes+1<<30 || request.Cmp(limit) != 0 {
		t.Errorf("memory request %s, limit %s: want both at least the %d-byte arena plus 1GiB", request.String(), limit.String(), s.CapacityBytes)
	}
	if s.LockMemory && (c.SecurityContext == nil || c.SecurityContext.Capabilities == nil || !slices.Contains(c.SecurityContext.Capabilities.Add, "IPC_LOCK")) {
		t.Error("lock_memory needs the IPC_LOCK capability")
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g < 60 {
		t.Errorf("termination grace %v: a daemon needs time to sync its journal and leave the map", g)
	}

	// Files and directories the settings name lie in the right volumes.
	shmVol, _ := mountOf(t, pod.Spec, c, filepath.Dir(s.ShmSocket))
	if segVol, _ := mountOf(t, pod.Spec, c, s.SegmentPath); shmVol.HostPath == nil || segVol.Name != shmVol.Name || !strings.HasPrefix(shmVol.HostPath.Path, "/dev/shm/") {
		t.Errorf("the shm socket and the arena must share a hostPath on the host's /dev/shm (engines mount it; the arena outlives the pod): %+v", shmVol)
	}
	if v, _ := mountOf(t, pod.Spec, c, s.DataDir); v.HostPath == nil {
		t.Errorf("data_dir %s is not on a hostPath: the journal would die with the pod", s.DataDir)
	}
	for name, f := range s.Files {
		if v, _ := mountOf(t, pod.Spec, c, f); v.Secret == nil && v.ConfigMap == nil {
			t.Errorf("%s %s is in volume %s, neither a Secret nor a ConfigMap", name, f, v.Name)
		}
	}

	// The PodDisruptionBudget and the PodMonitor select the daemons.
	pdb := m.get(t, "PodDisruptionBudget", "kvpool").(*policyv1.PodDisruptionBudget)
	selects(t, "PodDisruptionBudget kvpool", pdb.Spec.Selector, pod.Labels)
	pm := m.get(t, "PodMonitor", "kvpool").(*monitoringv1.PodMonitor)
	selects(t, "PodMonitor kvpool", &pm.Spec.Selector, pod.Labels)
	for _, e := range pm.Spec.PodMetricsEndpoints {
		if e.Port == nil {
			t.Fatal("PodMonitor endpoint without a port")
		}
		containerPort(t, c, *e.Port)
		if e.Path != "/metrics" {
			t.Errorf("PodMonitor scrapes %s", e.Path)
		}
	}

	checkEtcd(t, m, s)
	checkEngine(t, m, ds, s)
}

// checkEtcd: the StatefulSet's members, its Services and node.yaml's
// etcd_endpoints agree.
func checkEtcd(t *testing.T, m *manifests, s checkedSettings) {
	sts := m.get(t, "StatefulSet", "kvpool-etcd").(*appsv1.StatefulSet)
	selects(t, "StatefulSet kvpool-etcd", sts.Spec.Selector, sts.Spec.Template.Labels)
	headless := m.get(t, "Service", sts.Spec.ServiceName).(*corev1.Service)
	if headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s must be headless and publish members before they are ready", headless.Name)
	}
	for _, svc := range []*corev1.Service{headless, m.get(t, "Service", "kvpool-etcd-client").(*corev1.Service)} {
		selects(t, "Service "+svc.Name, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, sts.Spec.Template.Labels)
	}
	selects(t, "PodDisruptionBudget kvpool-etcd", m.get(t, "PodDisruptionBudget", "kvpool-etcd").(*policyv1.PodDisruptionBudget).Spec.Selector, sts.Spec.Template.Labels)
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Fatalf("etcd replicas %v, want 3", sts.Spec.Replicas)
	}
	c := container(t, sts.Spec.Template.Spec, "etcd")
	clientPort, peerPort := containerPort(t, c, "client").ContainerPort, containerPort(t, c, "peer").ContainerPort
	var members, endpoints []string
	for i := range int(*sts.Spec.Replicas) {
		host := fmt.Sprintf("%s-%d.%s.%s.svc", sts.Name, i, headless.Name, m.namespace)
		members = append(members, fmt.Sprintf("%s-%d=http://%s:%d", sts.Name, i, host, peerPort))
		endpoints = append(endpoints, fmt.Sprintf("http://%s:%d", host, clientPort))
	}
	if !slices.Equal(s.EtcdEndpoints, endpoints) {
		t.Errorf("node.yaml's etcd_endpoints %v; the StatefulSet's members serve %v", s.EtcdEndpoints, endpoints)
	}
	args, _ := expand(t, c, map[string]string{"metadata.name": sts.Name + "-1"})
	want := "--initial-cluster=" + strings.Join(members, ",")
	if !slices.Contains(args, want) {
		t.Errorf("etcd args %v lack %s", args, want)
	}
	if !slices.Contains(args, fmt.Sprintf("--advertise-client-urls=http://%s-1.%s.%s.svc:%d", sts.Name, headless.Name, m.namespace, clientPort)) {
		t.Errorf("etcd does not advertise the client URL the daemons use: %v", args)
	}
}

// checkEngine: the example engine pod reaches its node's daemon and its
// shared memory.
func checkEngine(t *testing.T, m *manifests, ds *appsv1.DaemonSet, s checkedSettings) {
	engine := m.get(t, "Pod", "engine-example").(*corev1.Pod)
	c := container(t, engine.Spec, "engine")
	_, env := expand(t, c, map[string]string{"status.hostIP": "10.0.0.11"})
	if env["KVPOOL_SERVER"] != s.Advertise {
		t.Errorf("the engine dials %q; its node's daemon advertises %q", env["KVPOOL_SERVER"], s.Advertise)
	}
	dsC := container(t, ds.Spec.Template.Spec, "kvpool")
	daemonVol, _ := mountOf(t, ds.Spec.Template.Spec, dsC, filepath.Dir(s.ShmSocket))
	// The daemon tells clients its socket's path, so the engine must see
	// the same directory at the same path.
	vol, mount := mountOf(t, engine.Spec, c, s.ShmSocket)
	if vol.HostPath == nil || vol.HostPath.Path != daemonVol.HostPath.Path || mount.MountPath != filepath.Dir(s.ShmSocket) {
		t.Errorf("the engine mounts %+v at %s; the daemon's socket is %s in hostPath %s", vol.VolumeSource, mount.MountPath, s.ShmSocket, daemonVol.HostPath.Path)
	}
	uid := "root"
	if sc := engine.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		uid = strconv.FormatInt(*sc.RunAsUser, 10)
	}
	if !slices.ContainsFunc(s.ShmAllow, func(a string) bool { return strings.Split(a, "=")[0] == uid }) {
		t.Errorf("the engine runs as uid %s, which shm_allow %v does not admit", uid, s.ShmAllow)
	}
	if !bytes.Equal([]byte(ds.Spec.Template.Spec.NodeSelector["kvpool.io/gpu"]), []byte(engine.Spec.NodeSelector["kvpool.io/gpu"])) {
		t.Error("the engine must run on nodes that run a daemon")
	}
}

// unitFile is a systemd unit's settings, by section and key, in order.
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, file string) unitFile {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	u := unitFile{}
	section := ""
	for n, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a setting: %q", file, n+1, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s is set %d times, want once", section, key, len(v))
	}
	return v[0]
}

// systemdVerify runs systemd-analyze verify on unit and fails on
// anything it says: it exits 0 on unknown keys and bad values, and only
// warns.
func systemdVerify(t *testing.T, unit string) {
	t.Helper()
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("KVPOOL_REQUIRE_TOOLS") != "" {
			t.Fatal("systemd-analyze is missing (KVPOOL_REQUIRE_TOOLS is set): apt-get install systemd")
		}
		t.Skip("systemd-analyze is missing (Debian: systemd)")
	}
	out, err := exec.Command(tool, "verify", "--man=no", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify %s: %v\n%s", filepath.Base(unit), err, out)
	}
}

// TestSystemdUnit checks deploy/systemd against this binary and systemd:
// systemd-analyze verify accepts the unit and the etcd drop-in; the
// unit's command lines, with the example node.yaml, pass --check-config;
// its directories are the ones node.yaml uses; and it is hardened
// without breaking what the daemon needs (the arena under /dev/shm
// outlives the service, memory can be locked).
func TestSystemdUnit(t *testing.T) {
	dir := "../../deploy/systemd"
	u := parseUnit(t, filepath.Join(dir, "kvpool.service"))
	const binary = "/usr/local/bin/kvpool"
	config := filepath.Join(t.TempDir(), "node.yaml")
	b, err := os.ReadFile(filepath.Join(dir, "node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(config, b, 0o600)
	var s checkedSettings
	for _, key := range []string{"ExecStartPre", "ExecStart"} {
		args := strings.Fields(u.one(t, "Service", key))
		if args[0] != binary {
			t.Fatalf("%s runs %s, want %s", key, args[0], binary)
		}
		args = args[1:]
		for i, a := range args {
			if a == "/etc/kvpool/node.yaml" {
				args[i] = config
			}
		}
		if !slices.Contains(args, "--check-config") {
			args = append(args, "--check-config")
		}
		decode(t, mustOK(t, kv(t, nil, args...)), &s)
	}
	if s.DataDir != "/var/lib/"+u.one(t, "Service", "StateDirectory") {
		t.Errorf("data_dir %s is not the unit's StateDirectory", s.DataDir)
	}
	if filepath.Dir(s.ShmSocket) != "/run/"+u.one(t, "Service", "RuntimeDirectory") || u.one(t, "Service", "RuntimeDirectoryPreserve") != "yes" {
		t.Errorf("shm_socket %s is not in the unit's preserved RuntimeDirectory", s.ShmSocket)
	}
	if s.SegmentPath != "" && !strings.HasPrefix(s.SegmentPath, "/dev/shm/") {
		t.Errorf("segment_path %s: ProtectSystem=strict leaves it read-only", s.SegmentPath)
	}
	for key, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"PrivateDevices": "no", "RemoveIPC": "no", "Type": "exec", "KillSignal": "SIGTERM", "SystemCallErrorNumber": "EPERM"} {
		if got := u.one(t, "Service", key); got != want {
			t.Errorf("%s=%s, want %s", key, got, want)
		}
	}
	if stop, err := time.ParseDuration(u.one(t, "Service", "TimeoutStopSec") + "s"); err != nil || !s.DrainOnStop ||
		s.DrainBudgetSeconds+pool.ShutdownGrace.Seconds()+10 > stop.Seconds() {
		t.Errorf("drain_on_stop %v with a %v s budget: TimeoutStopSec must cover it, the shutdown and 10 s more", s.DrainOnStop, s.DrainBudgetSeconds)
	}
	if s.LockMemory && u.one(t, "Service", "LimitMEMLOCK") != "infinity" {
		t.Error("lock_memory needs LimitMEMLOCK=infinity")
	}
	if !s.Secured {
		t.Error("the example node.yaml listens beyond loopback with no credentials")
	}

	// systemd's own check, with the binary at a path that exists here.
	unitDir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(filepath.Join(dir, "kvpool.service"))
	os.WriteFile(filepath.Join(unitDir, "kvpool.service"), bytes.ReplaceAll(b, []byte(binary), []byte(exe)), 0o644)
	systemdVerify(t, filepath.Join(unitDir, "kvpool.service"))

	// The etcd drop-in, over Debian's etcd.service.
	etcdUnit, err := os.ReadFile("/lib/systemd/system/etcd.service")
	if err != nil {
		if os.Getenv("KVPOOL_REQUIRE_TOOLS") != "" {
			t.Fatalf("Debian's etcd.service is missing (KVPOOL_REQUIRE_TOOLS is set): %v", err)
		}
		t.Skipf("no etcd.service to put the drop-in on (Debian: etcd-server): %v", err)
	}
	os.WriteFile(filepath.Join(unitDir, "etcd.service"), etcdUnit, 0o644)
	os.Mkdir(filepath.Join(unitDir, "etcd.service.d"), 0o755)
	dropIn, _ := os.ReadFile(filepath.Join(dir, "etcd.service.d", "kvpool.conf"))
	os.WriteFile(filepath.Join(unitDir, "etcd.service.d", "kvpool.conf"), dropIn, 0o644)
	systemdVerify(t, filepath.Join(unitDir, "etcd.service"))
	// Its variables are etcd flags (ETCD_QUOTA_BACKEND_BYTES is
	// --quota-backend-bytes).
	help, _ := exec.Command("etcd", "--help").CombinedOutput()
	for _, env := range parseUnit(t, filepath.Join(dir, "etcd.service.d", "kvpool.conf"))["Service"]["Environment"] {
		name, _, _ := strings.Cut(env, "=")
		flag := "--" + strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "ETCD_")), "_", "-")
		if !bytes.Contains(help, []byte(flag+" ")) && !bytes.Contains(help, []byte(flag+"\n")) && !bytes.Contains(help, []byte(flag+"=")) {
			t.Errorf("the drop-in sets %s, but etcd --help has no %s", name, flag)
		}
	}
}

// scrapeText is a daemon's /metrics.
func scrapeText(t *testing.T, metricsAddr string) string {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// scrapeFamilies adds the metric families a daemon's /metrics lists.
func scrapeFamilies(t *testing.T, metricsAddr string, into map[string]string) {
	t.Helper()
	for _, line := range strings.Split(scrapeText(t, metricsAddr), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			into[f[2]] = f[3]
		}
	}
}

// metricNames are the kvpool metrics an expression names, with a
// histogram's _bucket, _sum and _count series named by their family.
var metricName = regexp.MustCompile(`\b[a-z_][a-z0-9_]*\b`)

// promExprs are the dashboard's and the alerts' PromQL expressions, by
// where they come from; Grafana's variables are replaced by values
// PromQL parses.
func promExprs(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	b, err := os.ReadFile("../../deploy/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &rules); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			out["alert "+r.Alert] = r.Expr
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s needs a severity, a summary and a description", r.Alert)
			}
		}
	}
	b, err = os.ReadFile("../../deploy/grafana/kvpool.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("kvpool.json: %v", err)
	}
	grafana := strings.NewReplacer("$__rate_interval", "1m", "$instance", ".*")
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			out[fmt.Sprintf("panel %q query %d", p.Title, i)] = grafana.Replace(tg.Expr)
		}
	}
	return out
}

// TestDashboardAndAlerts runs two daemons (a cluster with a data
// directory and a disk tier, blocks put, evicted, fetched and planned),
// scrapes their /metrics, and fails when an expression of the Grafana
// dashboard or the Prometheus alerts names a kvpool metric they do not
// export. promtool check rules then parses the alerts, and every
// dashboard query as a recording rule.
func TestDashboardAndAlerts(t *testing.T) {
	dir := t.TempDir()
	// With a data dir the arena is a file under /dev/shm that outlives
	// the node on purpose; name it, and remove it once the node stopped
	// (cleanups run last first), or every run leaks its 16 MiB.
	seg := filepath.Join("/dev/shm", fmt.Sprintf("kvpool-cmd-test-dashboard-%d", os.Getpid()))
	t.Cleanup(func() { os.Remove(seg); os.Remove(seg + ".lock") })
	a := serve(t, "--capacity", "16MiB", "--data-dir", filepath.Join(dir, "a"), "--segment-path", seg, "--disk-dir", filepath.Join(dir, "a-disk"), "--disk-capacity", "64MiB")
	b := serve(t, "--capacity", "16MiB", "--node-id", "cmd-dashboard-b", "--etcd-endpoints", a.etcd)
	block := bytes.Repeat([]byte("kv"), 512<<10) // 1 MiB
	var keys []string
	for i := range 24 { // past the 16 MiB arena: evictions, and reads admit blocks to disk
		k := fmt.Sprintf("k%02d", i)
		keys = append(keys, k)
		mustOK(t, kv(t, block, "block", "put", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--key", k))
		for range 2 {
			mustOK(t, kv(t, nil, "block", "get", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--key", k, "--file", filepath.Join(dir, "out")))
		}
	}
	kv(t, nil, "block", "get", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--key", "absent", "--file", filepath.Join(dir, "out"))
	last := keys[len(keys)-4:]
	eventually.True(t, "B to fetch A's blocks", 30*time.Second, func() bool {
		r := kv(t, nil, "block", "fetch", "--server", b.addr, "--tenant", "acme", "--namespace", "m", "--keys", strings.Join(last, ","))
		return r.code == 0
	})
	mustOK(t, kv(t, nil, "chain", "plan", "--server", b.addr, "--tenant", "acme", "--namespace", "m", "--keys", strings.Join(last, ","), "--json"))

	// The cluster's own metrics say what happened: B planned once, and
	// both daemons see two live nodes in the map and in gossip.
	eventually.True(t, "B's metrics to show the cluster", 30*time.Second, func() bool {
		body := scrapeText(t, b.metrics)
		return strings.Contains(body, "\nkvpool_metadata_nodes 2\n") && strings.Contains(body, `kvpool_metadata_gossip_members{state="alive"} 2`) &&
			strings.Contains(body, `kvpool_metadata_gossip_members{state="dead"} 0`)
	})
	if n := regexp.MustCompile(`(?m)^kvpool_plan_decisions_total\{plan="[a-z]+",where="[a-z_]+"\} 1$`).FindAllString(scrapeText(t, b.metrics), -1); len(n) != 1 {
		t.Errorf("B answered one plan; its plan decisions: %q", n)
	}

	exported := map[string]string{"up": "gauge"} // Prometheus's own, per target
	scrapeFamilies(t, a.metrics, exported)
	scrapeFamilies(t, b.metrics, exported)
	exprs := promExprs(t)
	used := map[string]bool{}
	for where, expr := range exprs {
		for _, name := range metricName.FindAllString(expr, -1) {
			if !strings.HasPrefix(name, "kvpool_") && name != "up" {
				continue // a function, a label, a keyword
			}
			family := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] == "histogram" {
					family = base
				}
			}
			if _, ok := exported[family]; !ok {
				t.Errorf("%s names %s, which the daemons do not export", where, name)
			}
			used[family] = true
		}
	}
	var ours, unused []string
	for name := range exported {
		if strings.HasPrefix(name, "kvpool_") {
			ours = append(ours, name)
			if !used[name] {
				unused = append(unused, name)
			}
		}
	}
	slices.Sort(unused)
	t.Logf("%d kvpool metric families exported, %d used by the dashboard and alerts; not used: %v", len(ours), len(used), unused)

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("KVPOOL_REQUIRE_TOOLS") != "" {
			t.Fatal("promtool is missing (KVPOOL_REQUIRE_TOOLS is set): apt-get install prometheus")
		}
		t.Skip("promtool is missing (Debian: prometheus)")
	}
	if out, err := exec.Command(promtool, "check", "rules", "../../deploy/prometheus/alerts.yaml").CombinedOutput(); err != nil {
		t.Errorf("promtool check rules alerts.yaml: %v\n%s", err, out)
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, where := range slices.Sorted(maps.Keys(exprs)) {
		if strings.HasPrefix(where, "panel ") {
			q, _ := json.Marshal(exprs[where])
			fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", i, q)
		}
	}
	f := filepath.Join(dir, "dashboard-rules.yaml")
	os.WriteFile(f, []byte(rules.String()), 0o600)
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}
