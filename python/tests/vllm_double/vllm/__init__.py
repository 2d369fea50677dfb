"""Contract double of vLLM for tutti's tests (see ../README.md): not vLLM."""
IS_TUTTI_CONTRACT_DOUBLE = True
