#!/usr/bin/env bash
# Builds the test control plane from its Go modules into $HETEROSERVE_CACHE/bin (default
# ~/.cache/heteroserve/bin). Pinned versions; reuses what is already built; never writes into the
# repository. Each piece is built in a wrapper module because k8s.io/kubernetes and etcd's server
# require their sibling modules through replace directives, which `go install pkg@version` refuses.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.36.3}
ETCD_VERSION=${ETCD_VERSION:-v3.6.14}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.21.4}

CACHE=${HETEROSERVE_CACHE:-$HOME/.cache/heteroserve}
BIN=$CACHE/bin
SRC=$CACHE/src
mkdir -p "$BIN" "$SRC"

die() { echo "build-tools: $*" >&2; exit 1; }
command -v go >/dev/null || die "the 'go' tool is missing (Go >= 1.24 is needed to build kube-apiserver, etcd, kwok and helm). Install Go, or point the tests at an existing cluster: export HETEROSERVE_TEST_KUBECONFIG=/path/to/its/kubeconfig (for example a kind cluster; see docs/development.md)."

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -trimpath"
stamp_ok() { [ -x "$BIN/$1" ] && [ "$(cat "$BIN/.$1.version" 2>/dev/null)" = "$2" ]; }
stamp() { echo "$2" > "$BIN/.$1.version"; }

build_kubernetes() {
  if stamp_ok kube-apiserver "$K8S_VERSION" && stamp_ok kube-controller-manager "$K8S_VERSION" \
     && stamp_ok kube-scheduler "$K8S_VERSION"; then return; fi
  echo "build-tools: building kube-apiserver, kube-controller-manager, kube-scheduler $K8S_VERSION (tens of minutes on 2 cores, once)"
  local dir=$SRC/kubernetes-$K8S_VERSION upstream staging_version minor
  mkdir -p "$dir"
  upstream=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])') \
    || die "cannot download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy ($(go env GOPROXY)). Or point the tests at an existing cluster: export HETEROSERVE_TEST_KUBECONFIG=/path/to/its/kubeconfig."
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  staging_version="v0.${K8S_VERSION#v1.}"
  # The staging modules are the ones upstream replaces with ./staging/src/...; take the list from
  # the tag's own go.mod (it changes between releases) and pin each to its published v0.x.y.
  python3 - "$upstream" "$staging_version" "$dir/go.mod" "$K8S_VERSION" <<'PY'
import re, sys
upstream, staging_version, out, k8s_version = sys.argv[1:]
text = open(upstream).read()
go_line = re.search(r"^go (\S+)", text, re.M).group(1)
godebug = re.search(r"^godebug[^\n]*(\([^)]*\))?", text, re.M)
staging = re.findall(r"^\s*(k8s\.io/\S+)\s+=>\s+\./staging/", text, re.M)
lines = ["module heteroserve.local/k8s-control-plane", "", f"go {go_line}", ""]
if godebug:
    lines += [godebug.group(0), ""]
lines += ["require k8s.io/kubernetes " + k8s_version, ""]
lines += ["replace ("] + [f"\t{m} => {m} {staging_version}" for m in staging] + [")", ""]
open(out, "w").write("\n".join(lines))
PY
  (
    cd "$dir"
    ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
      -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
      -X k8s.io/component-base/version.gitTreeState=clean \
      -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
      -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION \
      -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
    GOFLAGS="$GOFLAGS -mod=mod" go build -ldflags "$ldflags" -o "$BIN/" \
      k8s.io/kubernetes/cmd/kube-apiserver \
      k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler
  ) || die "building Kubernetes $K8S_VERSION failed (see above). Or point the tests at an existing cluster: export HETEROSERVE_TEST_KUBECONFIG=/path/to/its/kubeconfig."
  for b in kube-apiserver kube-controller-manager kube-scheduler; do stamp "$b" "$K8S_VERSION"; done
}

build_etcd() {
  stamp_ok etcd "$ETCD_VERSION" && return
  echo "build-tools: building etcd $ETCD_VERSION"
  local dir=$SRC/etcd-$ETCD_VERSION upstream
  mkdir -p "$dir"
  upstream=$(go mod download -json "go.etcd.io/etcd/server/v3@$ETCD_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])') \
    || die "cannot download go.etcd.io/etcd/server/v3@$ETCD_VERSION from the Go module proxy."
  python3 - "$upstream" "$ETCD_VERSION" "$dir/go.mod" <<'PY'
import re, sys
upstream, version, out = sys.argv[1:]
text = open(upstream).read()
go_line = re.search(r"^go (\S+)", text, re.M).group(1)
siblings = sorted(set(re.findall(r"^\s*(go\.etcd\.io/etcd/\S+)\s+=>\s+\.\./", text, re.M)))
lines = ["module heteroserve.local/etcd", "", f"go {go_line}", "",
         f"require go.etcd.io/etcd/server/v3 {version}", ""]
if siblings:
    lines += ["replace ("] + [f"\t{m} => {m} {version}" for m in siblings] + [")", ""]
open(out, "w").write("\n".join(lines))
PY
  ( cd "$dir" && GOFLAGS="$GOFLAGS -mod=mod" go build -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3 ) \
    || die "building etcd $ETCD_VERSION failed (see above)."
  stamp etcd "$ETCD_VERSION"
}

build_kwok() {
  stamp_ok kwok "$KWOK_VERSION" && [ -d "$CACHE/kwok-stages" ] && return
  echo "build-tools: building kwok $KWOK_VERSION"
  GOBIN=$BIN go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" || die "building kwok $KWOK_VERSION failed (see above)."
  # The standalone binary ships no stages; copy the upstream stage definitions next to it.
  local mod
  mod=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION
  rm -rf "$CACHE/kwok-stages"; mkdir -p "$CACHE/kwok-stages"
  cp "$mod/kustomize/stage/node/fast/node-initialize.yaml" \
     "$mod/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
     "$mod/kustomize/stage/pod/fast/pod-ready.yaml" \
     "$mod/kustomize/stage/pod/fast/pod-complete.yaml" \
     "$mod/kustomize/stage/pod/fast/pod-delete.yaml" "$CACHE/kwok-stages/" \
    || die "kwok $KWOK_VERSION's stage files are not where expected under $mod/kustomize/stage"
  chmod -R u+w "$CACHE/kwok-stages"
  stamp kwok "$KWOK_VERSION"
}

build_helm() {
  stamp_ok helm "$HELM_VERSION" && return
  echo "build-tools: building helm $HELM_VERSION"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  # Without these, offline `helm template` assumes Kubernetes 1.20 for .Capabilities.KubeVersion.
  GOBIN=$BIN go install -ldflags "-s -w -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" || die "building helm $HELM_VERSION failed (see above)."
  stamp helm "$HELM_VERSION"
}

start=$(date +%s)
for piece in "${@:-etcd kwok helm kubernetes}"; do
  for p in $piece; do "build_$p"; done
done
echo "build-tools: tools ready in $BIN ($(( $(date +%s) - start )) s)"
