#!/bin/bash
# sandfleet's default run-tests.sh for Terminal-Bench-1 tasks that ship none.
# TB1's template installs uv and pytest from the network; sandfleet sandboxes are offline,
# so this runs the image's pytest (python3-pytest) instead, with the same -rA summary.
if [ "$PWD" = "/" ]; then
    echo "Error: No working directory set. Please set a WORKDIR in your Dockerfile before running this script."
    exit 1
fi
python3 -m pytest "$TEST_DIR/test_outputs.py" -rA
