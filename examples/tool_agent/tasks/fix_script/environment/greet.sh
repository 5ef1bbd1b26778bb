#!/bin/bash
# greet.sh NAME: print a greeting for NAME.
name="$1"
echo "Hello, $name!
