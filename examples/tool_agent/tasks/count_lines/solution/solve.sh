#!/bin/bash
wc -l < /app/inventory.txt > /app/answer.txt
