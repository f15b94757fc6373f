#!/usr/bin/env bash
# Run the GPU validation suite on a machine with CUDA (the device tool's H200 image
# has torch but not simpy/jsonschema: carry their wheels in .whl/, see below).
#
#   # on the development machine, once:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_17_x86_64 -d .whl \
#       simpy jsonschema jsonschema-specifications referencing rpds-py attrs
#   # then run this script there with .whl carried; the reports land in $OUT.
#
#   scripts/device_validate.sh [SUITE.toml ...]
#
# runs the CUDA tests, then each suite (default: validate/cuda.toml and
# validate/cuda-training.toml), each report in $OUT/report-<suite file's stem>.
set -euo pipefail
log="${OUT:-validate}"
mkdir -p "$log"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
suites=("$@")
if [ "${#suites[@]}" -eq 0 ]; then
  suites=(validate/cuda.toml validate/cuda-training.toml)
fi
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA here'; print(torch.cuda.get_device_name())"
# run the suite even when the tests fail (its report is still wanted), but exit
# non-zero if either failed: a GPU failure must not read as a pass
tests=0
python3 -m pytest -q tests/test_execute.py tests/test_validate.py \
  tests/test_import_torch_snapshot.py tests/test_amp_modeled.py 2>&1 | tee "$log/pytest-cuda.log" || tests=$?
suite=0
for f in "${suites[@]}"; do
  name=$(basename "$f" .toml)
  rc=0
  python3 -m snsim.cli validate --suite "$f" --out "$log/report-$name" || rc=$?
  echo "device_validate: $f exit $rc"
  if [ "$rc" -ne 0 ] && [ "$suite" -eq 0 ]; then suite=$rc; fi
done
if [ "$tests" -ne 0 ] || [ "$suite" -ne 0 ]; then
  echo "device_validate: FAILED (pytest exit $tests, suite exit $suite)" >&2
  exit 1
fi
echo "device_validate: tests and suite passed"
