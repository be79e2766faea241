# The git step's apply on another machine (steps/_support/remote_git.py sets dest, url, ref, force, attempts,
# depth, update and submodules above this text, then sends it on stdin). POSIX sh; lines starting
# "RUNNER-GIT " are what the step reads back.
export GIT_TERMINAL_PROMPT=0 LC_ALL=C
say() { echo "RUNNER-GIT $*"; }
fail() { say "FAIL $*"; exit 3; }
# a network operation: retried while what git says is a network failure ($network, as the local kind's); on
# failure $_why says which it was: NET (the network, after every attempt) or GIT (the request itself)
net() { _n=1; while :; do
    echo "$ git $*"
    _o=$(mktemp "${TMPDIR:-/tmp}/runner-git.XXXXXXXX") || { _why=GIT; return 1; }
    { git -c advice.detachedHead=false "$@" 2>&1; echo $? > "$_o.rc"; } | tee "$_o"
    _rc=$(cat "$_o.rc" 2>/dev/null); grep -qiE "$network" "$_o"; _isnet=$?; rm -f -- "$_o" "$_o.rc"
    [ "$_rc" = 0 ] && return 0
    _why=GIT; [ $_isnet = 0 ] || return 1
    _why=NET; [ $_n -ge $attempts ] && return 1
    echo "runner: git $1 attempt $_n of $attempts failed; retrying"; sleep $((_n * 2)); _n=$((_n + 1)); done; }
run() { echo "$ git $*"; git -c advice.detachedHead=false "$@"; }
norm() { _u=${1%/}; echo "${_u%.git}"; }
is_commit() { case $1 in *[!0-9a-fA-F]*|'') return 1;; esac; [ ${#1} -ge 7 ] && [ ${#1} -le 40 ]; }
parent=$(dirname -- "$dest"); name=$(basename -- "$dest")
mkdir -p -- "$parent" || fail "cannot make $parent"
# absolute from here on: the script changes directory (into a clone, back out), and a relative `dest` is the
# login directory's
parent=$(cd -- "$parent" && pwd -P) || fail "cannot enter $parent"; dest="$parent/$name"
for _t in "$parent"/."$name".runner-clone-*; do
  [ -e "$_t" ] || continue
  _pid=${_t##*.runner-clone-}
  if [ -n "$_pid" ] && kill -0 "$_pid" 2>/dev/null; then fail "$dest is being cloned by another apply (pid $_pid)"; fi
  rm -rf -- "$_t"
done
if [ -e "$dest" ] && [ -n "$(ls -A -- "$dest" 2>/dev/null)$( [ -d "$dest" ] || echo file)" ]; then
  cd -- "$dest" || fail "cannot enter $dest"
  [ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ] || fail "NOTGIT"
  cur=$(git config --get remote.origin.url || true)
  if [ "$(norm "$cur")" != "$(norm "$url")" ]; then
    [ $force = 1 ] || fail "ORIGIN $cur"
    if [ -n "$cur" ]; then run remote set-url origin "$url"; else run remote add origin "$url"; fi || fail "cannot set origin"
  fi
  branch=
  if [ -z "$ref" ]; then
    ref=$(git symbolic-ref -q refs/remotes/origin/HEAD 2>/dev/null | sed 's|^refs/remotes/origin/||'); [ -n "$ref" ] || ref=main
  fi
  if is_commit "$ref"; then
    git rev-parse -q --verify "$ref^{commit}" >/dev/null || net fetch origin "$ref" $depth || fail "${_why:-GIT} fetch"
    target=$(git rev-parse -q --verify "$ref^{commit}" || git rev-parse -q --verify "FETCH_HEAD^{commit}")
    case $target in "$(echo "$ref" | tr A-F a-f)"*) ;; *) fail "NOCOMMIT";; esac
  else
    target=$(git rev-parse -q --verify "refs/tags/$ref^{commit}" || true)
    if [ -z "$target" ] || [ $update = 1 ]; then
      if [ $update = 1 ] || ! git rev-parse -q --verify "refs/remotes/origin/$ref" >/dev/null; then
        if net fetch origin "+refs/heads/$ref:refs/remotes/origin/$ref" $depth; then :
        elif [ -z "$target" ]; then
          net fetch origin "+refs/tags/$ref:refs/tags/$ref" $depth || fail "NOREF"
          target=$(git rev-parse -q --verify "refs/tags/$ref^{commit}") || fail "NOREF"
        fi
      fi
      _b=$(git rev-parse -q --verify "refs/remotes/origin/$ref" || true)
      if [ -n "$_b" ]; then target=$_b; branch=$ref; fi
    fi
    [ -n "$target" ] || fail "NOREF"
  fi
  now=$(git rev-parse -q --verify HEAD || true); onbranch=$(git symbolic-ref -q --short HEAD || true)
  if [ "$now" = "$target" ] && { [ -z "$branch" ] || [ "$onbranch" = "$branch" ]; }; then
    say SAME
  else
    if [ $force = 0 ] && ! git diff-index --quiet HEAD -- 2>/dev/null; then fail "DIRTY $(git diff --name-only HEAD | head -n 5 | tr '\n' ' ')"; fi
    f=; [ $force = 1 ] && f=--force
    if [ -n "$branch" ]; then
      run checkout $f -B "$branch" "$target" && run branch --set-upstream-to "origin/$branch" "$branch" || fail "checkout"
    else
      run checkout $f --detach "$target" || fail "checkout"
    fi
    if [ $submodules = 1 ]; then net submodule update --init --recursive || fail "${_why:-GIT} submodule update"; fi
  fi
else
  tmp="$parent/.$name.runner-clone-$$"
  b=; is_commit "$ref" || { [ -n "$ref" ] && b="--branch $ref"; }
  rm -rf -- "$tmp"
  net clone --progress $depth $b -- "$url" "$tmp" || { rm -rf -- "$tmp"; fail "${_why:-GIT} clone"; }
  if is_commit "$ref"; then
    cd -- "$tmp"
    git rev-parse -q --verify "$ref^{commit}" >/dev/null || net fetch origin "$ref" $depth || { rm -rf -- "$tmp"; fail "${_why:-GIT} fetch"; }
    target=$(git rev-parse -q --verify "$ref^{commit}" || git rev-parse -q --verify "FETCH_HEAD^{commit}" || true)
    case $target in "$(echo "$ref" | tr A-F a-f)"*) ;; *) rm -rf -- "$tmp"; fail "NOCOMMIT";; esac
    run checkout --detach "$target" || fail "checkout"
    cd -- "$parent"
  fi
  if [ $submodules = 1 ]; then
    cd -- "$tmp" && net submodule update --init --recursive || { cd -- "$parent"; rm -rf -- "$tmp"; fail "${_why:-GIT} submodule update"; }
    cd -- "$parent"
  fi
  [ -d "$dest" ] && rmdir -- "$dest" 2>/dev/null
  mv -- "$tmp" "$dest" || { rm -rf -- "$tmp"; fail "APPEARED"; }
fi
cd -- "$dest" && say "DONE $(git rev-parse HEAD) $(pwd -P) $(git symbolic-ref -q --short HEAD)"
