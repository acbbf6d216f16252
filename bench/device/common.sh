# Sourced by the scripts of bench/device/ on the GPU machine, from the repo root: the steps they share.

# The package laid out under /tmp/pkg as pyproject.toml's package-dir maps it (once per machine: /tmp is kept warm).
layout_package() {
  [ -d /tmp/pkg/aheadrank ] && return 0
  mkdir -p /tmp/pkg/aheadrank
  for e in aheadrank/*; do ln -s "$PWD/$e" /tmp/pkg/aheadrank/; done
  for d in rankers store indexer services; do ln -s "$PWD/$d" /tmp/pkg/aheadrank/$d; done
}

# The float16 base in /tmp/minilm (once): .gpu/minilm where make_payload.sh put one, else .gpu-lf's xz'd one
# (label_free_payload.sh), so that one base travels when both payloads do.
unpack_base() {
  [ -d /tmp/minilm ] && return 0
  if [ -d .gpu/minilm ]; then
    cp -r .gpu/minilm /tmp/minilm
  else
    cp -r .gpu-lf/minilm /tmp/minilm && xz -d /tmp/minilm/model.safetensors.xz
  fi
}
