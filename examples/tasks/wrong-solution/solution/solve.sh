#!/bin/bash
# Wrong on purpose: this copies the sentence instead of reversing it.
cp /app/sentence.txt /app/reversed.txt
