"""The OLMo-2 family (`olmo2`): post-norm blocks and a QK-norm over the whole q and k projections. Its config
(`config.py`), tensor map (`names.py`) and forward over ops (`forward.py`); `family.py` registers it."""
