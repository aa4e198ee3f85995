#!/usr/bin/env bash
# The system tools some tests need besides the services (scripts/services.sh): chromium and
# chromium-driver (the console's browser tests, through Playwright, never a browser
# download), promtool (Debian's prometheus package: the alert rule tests), faketime (tests
# that shift a process's clock) and docker-compose (the compose file check, no engine).
# Run as root on a machine with apt-get, it installs the missing ones; otherwise it says
# which, and how. It never fails `make test`: a test whose tool is missing is skipped on a
# laptop (its reason names the package) and fails in CI.
set -u
APT_GET="${APT_GET:-apt-get}"
need=()
command -v "${CONSOLE_CHROMIUM:-chromium}" >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v faketime >/dev/null 2>&1 || need+=(faketime)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
[ "${#need[@]}" -eq 0 ] && exit 0

if [ "${EUID:-$(id -u)}" -eq 0 ] && command -v "$APT_GET" >/dev/null 2>&1; then
  echo "test-deps: installing ${need[*]} (apt-get)"
  if ! { DEBIAN_FRONTEND=noninteractive "$APT_GET" update -qq \
      && DEBIAN_FRONTEND=noninteractive "$APT_GET" install -y -qq --no-install-recommends "${need[@]}"; } >/dev/null; then
    echo "test-deps: apt-get could not install ${need[*]}: the tests that need them are skipped (they fail in CI)"
  fi
else
  echo "test-deps: ${need[*]} not installed: the tests that need them are skipped (they fail in CI);"
  echo "test-deps: install them with: sudo apt-get install --no-install-recommends ${need[*]}"
fi
exit 0
