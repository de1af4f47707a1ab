"""How a run is laid out in bytes: the Zarr v3 arrays of a run (`arrays.ZarrArrayStore`, with the
int8 run's arrays in `one_byte_arrays`), what a shard object carries (`shard_details`), the codecs
and the parts of the Zarr spec the store codes itself (`codecs`, `zarr_spec`), one-byte coding
(`quantised`), the calls to the byte store (`store_calls`) and what damaged bytes raise (`damage`)."""
