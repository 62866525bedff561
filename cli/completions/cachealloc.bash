# Bash completion for cachealloc-analyze, cachealloc-conformance,
# cachealloc-seed-example and cachealloc-synthetic. Options and subcommands
# are read from the tool's own --help, so they never go stale.
# Installed as share/bash-completion/completions/<tool>.

_cachealloc_help_words() {
  # $1: the tool, $2: its subcommand or "". Prints option names, and for the
  # top level of cachealloc-analyze its subcommands.
  local help
  help=$("$1" ${2:+"$2"} --help 2>/dev/null) || return
  printf '%s\n' "$help" | grep -oE '(^|[ ,])--?[A-Za-z][A-Za-z0-9-]*' | tr -d ' ,' | sort -u
  if [[ -z $2 ]]; then
    printf '%s\n' "$help" | awk '/^Subcommands:/ {on=1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on=0}'
  fi
}

_cachealloc() {
  local cur prev tool sub word
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  tool=${COMP_WORDS[0]}
  case $prev in
    -o|--output|--snapshot|--record-addresses) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --format) COMPREPLY=($(compgen -W "table csv json jsonl" -- "$cur")); return ;;
    --to-format) COMPREPLY=($(compgen -W "ours pickle" -- "$cur")); return ;;
    --stacks) COMPREPLY=($(compgen -W "none native" -- "$cur")); return ;;
    --device) [[ $tool == *conformance ]] && COMPREPLY=($(compgen -W "simulated cuda" -- "$cur")); return ;;
    --what) COMPREPLY=($(compgen -W "timeline events segments sites perfetto" -- "$cur")); return ;;
    --metric) COMPREPLY=($(compgen -W "allocated requested reserved" -- "$cur")); return ;;
    --addresses) COMPREPLY=($(compgen -W "recorded model" -- "$cur")); return ;;
    --by) COMPREPLY=($(compgen -W "bytes count peak allocated end" -- "$cur")); return ;;
  esac
  sub=""
  if [[ $tool == *cachealloc-analyze ]]; then
    local subcommands="summary segments fragmentation timeline peak top leaks oom events export convert flamegraph html diff ranks replay check recommend"
    for word in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
      [[ " $subcommands " == *" $word "* ]] && sub=$word
    done
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_cachealloc_help_words "$tool" "$sub" | grep '^-')" -- "$cur"))
  elif [[ $tool == *cachealloc-analyze && -z $sub ]]; then
    COMPREPLY=($(compgen -W "$(_cachealloc_help_words "$tool" "" | grep -v '^-')" -- "$cur") $(compgen -f -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}

complete -o filenames -F _cachealloc cachealloc-analyze cachealloc-conformance cachealloc-seed-example cachealloc-synthetic
