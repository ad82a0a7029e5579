#!/bin/bash
set -euo pipefail
cd /app
printf '%s\n' \
'CC := gcc' \
'CFLAGS := -Wall -Wextra -O2 -Isrc' \
'BUILD := build' \
'' \
'.PHONY: all test clean' \
'' \
'all: $(BUILD)/vecdemo' \
'' \
'$(BUILD):' \
'	mkdir -p $(BUILD)' \
'' \
'$(BUILD)/%.o: src/%.c src/vec.h | $(BUILD)' \
'	$(CC) $(CFLAGS) -c -o $@ $<' \
'' \
'$(BUILD)/test_vec.o: tests/test_vec.c src/vec.h | $(BUILD)' \
'	$(CC) $(CFLAGS) -c -o $@ $<' \
'' \
'$(BUILD)/vecdemo: $(BUILD)/main.o $(BUILD)/vec.o' \
'	$(CC) $(CFLAGS) -o $@ $^' \
'' \
'$(BUILD)/test_vec: $(BUILD)/test_vec.o $(BUILD)/vec.o' \
'	$(CC) $(CFLAGS) -o $@ $^' \
'' \
'test: $(BUILD)/test_vec' \
'	./$(BUILD)/test_vec' \
'' \
'clean:' \
'	rm -rf $(BUILD)' > Makefile
make clean
make
make test
