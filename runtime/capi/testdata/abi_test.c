// A C program against tutti.h and libtutti.so: what an engine written in C
// sees. Built and run by TestCProgram (header_test.go). Argument: a store
// directory. Prints "ok" and exits 0, or names the failed check and exits 1.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tutti.h"

static int failures;

#define CHECK(cond)                                                                  \
	do {                                                                             \
		if (!(cond)) {                                                               \
			char msg[512];                                                           \
			tutti_last_error(msg, sizeof msg);                                       \
			fprintf(stderr, "%s:%d: %s failed (last error: %s)\n", __FILE__, __LINE__, \
			        #cond, msg);                                                     \
			failures++;                                                              \
		}                                                                            \
	} while (0)

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: abi_test DIR\n");
		return 2;
	}
	CHECK(tutti_abi_version() >> 16 == TUTTI_ABI_MAJOR);

	// Errors are codes plus a message; NULLs never crash.
	uint64_t store = 0;
	CHECK(tutti_open(NULL, &store) == TUTTI_ERR_INVALID_ARGUMENT);
	int64_t n = tutti_last_error(NULL, 0);
	CHECK(n > 0);
	char small[8];
	CHECK(tutti_last_error(small, sizeof small) == n && strlen(small) == 7);
	CHECK(tutti_close(0) == TUTTI_ERR_BAD_HANDLE);

	const char *dirs[] = {argv[1]};
	tutti_config cfg;
	memset(&cfg, 0, sizeof cfg);
	cfg.struct_size = sizeof cfg;
	cfg.abi_major = TUTTI_ABI_MAJOR;
	cfg.dirs = dirs;
	cfg.num_dirs = 1;
	cfg.path = TUTTI_PATH_CPU;
	cfg.capacity_bytes = 64 << 20;
	cfg.layers = 2;
	cfg.kv_heads = 2;
	cfg.head_dim = 64;
	cfg.dtype = TUTTI_DTYPE_FP16;
	cfg.planes = 2;
	cfg.page_tokens = 16;
	cfg.chunk_pages = 1;
	cfg.layout = TUTTI_LAYOUT_PER_LAYER;
	cfg.num_pages = 16;
	cfg.staging_bytes = 2 << 20;
	cfg.staging_slot_bytes = 1 << 20;
	CHECK(tutti_open(&cfg, &store) == TUTTI_OK && store != 0);

	// Per-layer KV memory: [2, 16 pages, 16 tokens, 2 heads, 64 dims] fp16.
	const uint64_t plane = 16 * 2 * 64 * 2, layer_bytes = 2 * 16 * plane;
	uint8_t *kv[2];
	tutti_kv_region regions[2];
	for (int l = 0; l < 2; l++) {
		kv[l] = aligned_alloc(4096, layer_bytes);
		for (uint64_t i = 0; i < layer_bytes; i++) {
			kv[l][i] = (uint8_t)(i * 131 + l * 7 + (i >> 12));
		}
		regions[l].addr = (uint64_t)(uintptr_t)kv[l];
		regions[l].len_bytes = layer_bytes;
	}
	regions[1].len_bytes--;
	CHECK(tutti_register_kv(store, TUTTI_MEMORY_HOST, regions, 2) == TUTTI_ERR_GEOMETRY);
	regions[1].len_bytes++;
	CHECK(tutti_register_kv(store, TUTTI_MEMORY_HOST, regions, 2) == TUTTI_OK);

	uint32_t tokens[48];
	for (int i = 0; i < 48; i++) {
		tokens[i] = 1000 + i;
	}
	uint64_t chain[3];
	uint32_t len = 0;
	CHECK(tutti_chain_from_tokens(tokens, 48, 16, 0, chain, 3, &len) == TUTTI_OK && len == 3);

	int32_t src[3] = {1, 2, 3}, dst[3] = {9, 10, 11}, bad[3] = {1, 2, 16};
	uint64_t save = 0, load = 0;
	CHECK(tutti_save(store, chain, 3, bad, 3, &save) == TUTTI_ERR_OUT_OF_RANGE);
	CHECK(tutti_save(store, chain, 3, src, 3, &save) == TUTTI_OK);
	CHECK(tutti_save_wait_gathered(save) == TUTTI_OK);
	CHECK(tutti_save_release(save) == TUTTI_OK);
	CHECK(tutti_save_release(save) == TUTTI_ERR_BAD_HANDLE);
	CHECK(tutti_wait_saves(store) == TUTTI_OK);

	uint32_t hit = 0;
	CHECK(tutti_lookup(store, chain, 3, &hit) == TUTTI_OK && hit == 3);
	CHECK(tutti_load(store, chain, 3, dst, 3, &load) == TUTTI_OK);
	uint32_t cached = 0, planned = 0, blocks = 0;
	CHECK(tutti_load_plan(load, &cached, &planned) == TUTTI_OK && cached == 3 && planned == 3);
	for (int l = 0; l < 2; l++) {
		CHECK(tutti_load_wait_layer(load, l) == TUTTI_OK);
	}
	CHECK(tutti_load_wait_layer(load, 2) == TUTTI_ERR_OUT_OF_RANGE);
	CHECK(tutti_load_wait(load, &blocks) == TUTTI_OK && blocks == 3);
	int32_t why = -1;
	CHECK(tutti_load_failure(load, &why) == TUTTI_OK && why == TUTTI_OK);
	CHECK(tutti_load_failure(load, NULL) == TUTTI_ERR_INVALID_ARGUMENT);
	CHECK(tutti_load_release(load) == TUTTI_OK);
	for (int l = 0; l < 2; l++) {
		for (int p = 0; p < 2; p++) {
			for (int b = 0; b < 3; b++) {
				const uint8_t *a = kv[l] + (p * 16 + src[b]) * plane, *c = kv[l] + (p * 16 + dst[b]) * plane;
				CHECK(memcmp(a, c, plane) == 0);
			}
		}
	}

	tutti_stats st;
	memset(&st, 0, sizeof st);
	st.struct_size = sizeof st;
	CHECK(tutti_get_stats(store, &st) == TUTTI_OK && st.restored_blocks == 3 && st.saved_blocks == 3);
	// ABI 1.6: all the stats as JSON, asked for by length first.
	uint64_t json_len = 0;
	CHECK(tutti_get_stats_json(store, NULL, 0, &json_len) == TUTTI_ERR_BUFFER_TOO_SMALL && json_len > 0);
	char *json = malloc(json_len + 1);
	CHECK(json != NULL && tutti_get_stats_json(store, json, json_len, &json_len) == TUTTI_ERR_BUFFER_TOO_SMALL);
	CHECK(tutti_get_stats_json(store, json, json_len + 1, &json_len) == TUTTI_OK && strlen(json) == json_len);
	CHECK(strstr(json, "{\"path\":{\"used\":\"cpu\",") == json && json[json_len - 1] == '}');
	CHECK(strstr(json, "\"restored_blocks\":3,") != NULL && strstr(json, "\"saved_blocks\":3,") != NULL);
	CHECK(tutti_get_stats_json(store, json, json_len + 1, NULL) == TUTTI_ERR_INVALID_ARGUMENT);
	free(json);
	tutti_recovery rec;
	memset(&rec, 0, sizeof rec);
	rec.struct_size = sizeof rec;
	CHECK(tutti_get_recovery(store, &rec) == TUTTI_OK && rec.indexed_runs == 0 && rec.dropped_runs == 0);
	rec.struct_size = 4;
	CHECK(tutti_get_recovery(store, &rec) == TUTTI_ERR_VERSION);
	// The GPU reads are sized to the devices by default (the flag below asks for it again).
	uint64_t text_len = 99;
	char text[1024];
	CHECK(tutti_get_gpu_reads(store, NULL, 0, &text_len) == TUTTI_ERR_BUFFER_TOO_SMALL && text_len > 0);
	CHECK(tutti_get_gpu_reads(store, text, sizeof text, &text_len) == TUTTI_OK && text_len > 0 && strstr(text, "window ") == text);
	CHECK(tutti_get_gpu_reads(store, text, sizeof text, NULL) == TUTTI_ERR_INVALID_ARGUMENT);
	CHECK(tutti_close(store) == TUTTI_OK);
	CHECK(tutti_lookup(store, chain, 3, &hit) == TUTTI_ERR_BAD_HANDLE);
	CHECK(tutti_get_gpu_reads(store, text, sizeof text, &text_len) == TUTTI_ERR_BAD_HANDLE);
	CHECK(tutti_get_stats_json(store, text, sizeof text, &text_len) == TUTTI_ERR_BAD_HANDLE);

	// ABI 1.3's save writes per device: checked; a 1.2 caller's shorter
	// struct does not reach it (what lies past struct_size is not read).
	cfg.save_writes_per_device = 300;
	CHECK(tutti_open(&cfg, &store) == TUTTI_ERR_INVALID_ARGUMENT && tutti_last_error(small, sizeof small) > 0);
	cfg.struct_size = offsetof(tutti_config, save_writes_per_device);
	CHECK(tutti_open(&cfg, &store) == TUTTI_OK);
	CHECK(tutti_close(store) == TUTTI_OK);
	cfg.struct_size = sizeof cfg;
	cfg.save_writes_per_device = 4;
	CHECK(tutti_open(&cfg, &store) == TUTTI_OK);
	CHECK(tutti_close(store) == TUTTI_OK);
	cfg.save_writes_per_device = 0;

	// ABI 1.4: a reopen with another capacity is a settings mismatch, and
	// the message names the setting.
	cfg.capacity_bytes = 32 << 20;
	char mismatch[512];
	CHECK(tutti_open(&cfg, &store) == TUTTI_ERR_SETTINGS_MISMATCH && tutti_last_error(mismatch, sizeof mismatch) > 0 &&
	      strstr(mismatch, "CapacityBytes") != NULL);
	cfg.capacity_bytes = 64 << 20;

	// The GPU reads sized to the directory's disk at open, said as text.
	cfg.gpu_flags = TUTTI_GPU_READS_FROM_DEVICES | 4;
	CHECK(tutti_open(&cfg, &store) == TUTTI_ERR_INVALID_ARGUMENT);
	cfg.gpu_flags = TUTTI_GPU_READS_FROM_DEVICES;
	cfg.gpu_lookahead = 3;
	CHECK(tutti_open(&cfg, &store) == TUTTI_OK);
	CHECK(tutti_get_gpu_reads(store, NULL, 0, &text_len) == TUTTI_ERR_BUFFER_TOO_SMALL && text_len > 0);
	CHECK(tutti_get_gpu_reads(store, text, text_len, &text_len) == TUTTI_ERR_BUFFER_TOO_SMALL);
	CHECK(text_len < sizeof text && tutti_get_gpu_reads(store, text, text_len + 1, &text_len) == TUTTI_OK);
	CHECK(strlen(text) == text_len && strstr(text, "window ") == text && strstr(text, "lookahead 3 layers") != NULL);
	CHECK(tutti_close(store) == TUTTI_OK);
	free(kv[0]);
	free(kv[1]);
	if (failures) {
		return 1;
	}
	printf("ok\n");
	return 0;
}
