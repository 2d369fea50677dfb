// Package kvevents publishes what a tutti store serves as vLLM KV events, so
// the cache-aware routers of the field (llm-d's KV-cache indexer, NVIDIA
// Dynamo's KV router) can send a request to the node whose disks hold its
// prefix.
//
// # Wire format (vllm/distributed/kv_events.py)
//
// A ZeroMQ PUB socket sends one three-frame message per batch:
//
//	frame 0: topic (Config.Topic, e.g. "kv@<pod>@<model>"; may be empty)
//	frame 1: sequence number, 8 bytes big-endian, +1 per batch, from 0 in each process epoch
//	frame 2: msgpack of KVEventBatch, array-like: [ts float64, [event...], data_parallel_rank int]
//
// The events take one of two layouts (Format), named by the vLLM release
// whose subscribers read them. FormatVLLM026, the default, is vLLM 0.26's:
// its structs are msgspec structs with tag=True and omit_defaults, so each
// event is a map whose first key "type" holds the class name, then the
// fields in declaration order, those at their default (None) left out:
//
//	{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
//	 "lora_id", "medium", "lora_name", ["extra_keys"], ["group_idx"], ["locality"]}
//	{"type": "BlockRemoved", "block_hashes", "medium", ["group_idx"], ["locality"]}
//	{"type": "AllBlocksCleared"}
//
// tutti's stores publish medium "FS" (vLLM 0.26's MEDIUM_FS, what its own
// file-system tier publishes) with locality "LOCAL", and group_idx 0.
// FormatVLLM011 is vLLM 0.11's: each event an array whose first element is
// the tag, without the fields 0.26 added, medium "DISK" (what the routers of
// that time count as their disk tier):
//
//	["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size, lora_id|nil, medium]
//	["BlockRemoved", block_hashes, medium]
//	["AllBlocksCleared"]
//
// A block hash is an ExternalBlockHash: an int (vLLM's default,
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: the last 8 bytes of the sha256
// big-endian) or bytes (the raw hash). data_parallel_rank is always written:
// omit_defaults would drop a None rank and llm-d rejects a two-element batch.
// Integers take msgpack's smallest encoding and ts is a float64, as msgspec
// writes them. testdata/vllm-0.26.golden holds bytes vLLM 0.26's own structs
// wrote (testdata/vllm_golden.py), golden_test.go what python3-msgpack wrote
// for 0.11; DecodeBatch reads both layouts.
//
// # Replay (vLLM's ROUTER protocol)
//
// A client (DEALER) sends ["", start_seq 8 bytes big-endian]; the endpoint
// answers with ["", seq, payload] messages and ends with ["", -1 as 8 bytes,
// ""]. While the ring of recent batches (Config.ReplayBatches) holds every
// batch from start_seq on, those are sent, as vLLM does. Otherwise (the gap
// is older than the ring, or the publisher dropped events and left a
// sequence gap on purpose) the answer is the current contents: batches that
// all carry the sequence number S of the last published batch, the first
// beginning with AllBlocksCleared, then BlockStored parents first, so that a
// subscriber that applies them holds exactly what the store served after
// batch S, and continues with the live batch S+1.
//
// # Events the engine publishes (Config.Engine)
//
// Where the engine publishes KV events itself (vLLM, whose router stream
// also carries its GPU blocks), a publisher binds nothing: the engine takes
// the events (Publisher.Take) as one array of events in the format. The
// first take, and the first after the queue overflowed, lists the contents
// after an AllBlocksCleared that speaks for this store only: the engine
// replaces what it knew of the store with what follows, and must not pass
// that event on.
//
// # Ordering and bounds
//
// The store calls [Publisher.Do] around every change of what it serves: the
// change and the events it emits are one step of a single order, so a block
// evicted and saved again is always Removed before it is Stored again. Do
// never blocks on the network: events go to a bounded queue
// (Config.MaxQueueEvents); past it they are dropped and counted, and the next
// batch skips a sequence number so subscribers see the gap and repair it
// through the replay endpoint (an engine's next take lists the contents). The
// PUB socket's own queue is bounded (Config.SendQueueBatches); a subscriber
// too slow for it loses batches, which it sees as a sequence gap too.
package kvevents
