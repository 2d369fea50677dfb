"""KVConnectorFactory as vLLM's (newest tree): import kv_connector_module_path,
take class kv_connector, require a KVConnectorBase_V1 subclass whose
constructor accepts kv_cache_config, construct cls(vllm_config, role,
kv_cache_config)."""
import importlib
import inspect

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


class KVConnectorFactory:
    @staticmethod
    def get_connector_class(kv_transfer_config):
        mod = importlib.import_module(kv_transfer_config.kv_connector_module_path)
        cls = getattr(mod, kv_transfer_config.kv_connector)
        if not (isinstance(cls, type) and issubclass(cls, KVConnectorBase_V1)):
            raise ValueError(f"{cls} is not a subclass of KVConnectorBase_V1")
        return cls

    @staticmethod
    def create_connector(config, role, kv_cache_config=None):
        cls = KVConnectorFactory.get_connector_class(config.kv_transfer_config)
        if "kv_cache_config" not in inspect.signature(cls.__init__).parameters:
            raise ValueError(f"Connector {cls.__name__} must accept kv_cache_config in its constructor")
        return cls(config, role, kv_cache_config)
