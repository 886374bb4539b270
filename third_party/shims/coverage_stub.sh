#!/bin/sh
echo "coverage tooling is not available in this offline build" >&2
exit 1
