"""KVConnectorBase: what the worker mixin asserts a connector is."""
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

KVConnectorBase = KVConnectorBase_V1
