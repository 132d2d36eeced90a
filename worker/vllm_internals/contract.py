"""What the worker relies on inside vLLM, as data: for each module of the worker that needs vLLM's
internals (the seam's, and a few outside it that read vLLM's public objects), the classes, callables
and values it uses, each with what it calls them with or reads and writes on them.

One entry a line, ``module:name`` then what is used:

- ``module:Class{attr, ...}``: a class, and the attributes the worker reads or writes on its
  instances (a class attribute or method, an annotated field, or one the class's source assigns
  as ``self.<attr>``, in it or a base);
- ``module:Class.method(param, ...)`` or ``module:function(param, ...)``: a callable, and the
  parameters the worker passes, by name or position (for a class: its constructor's);
- ``module:Class.MEMBER`` or ``module:name``: a value that must exist (an enum member, a registry).

An entry holds for every release the seam spans (:data:`worker.vllm_internals.release.SUPPORTED`)
unless it starts with ``0.32 only:`` or ``0.34 only:``: what one release has and the other lacks,
used by the variant the seam picks for that release (:mod:`worker.vllm_internals.variants`).
:func:`entries_for` is a release's share of the table: what the boot checks against the installed
vLLM, and the wheel check against the wheel's.

Checked against the installed vLLM (its release's entries) by ``tests/test_vllm_contract.py`` (importlib and inspect:
:mod:`worker.vllm_internals.check`, which the boot runs too), and against another vLLM's wheel
without importing it by ``python -m worker vllm-contract --wheel vllm==X`` (its sources parsed:
:mod:`worker.tools.vllm_contract`; docs/vllm-contract.md), which ``tests/test_vllm_wheel_contract.py``
runs on the image's pinned wheel. ``tests/test_vllm_contract.py`` also keeps
it in step with the seam's source: every name the seam imports from vLLM, and every private name of
vLLM's it touches, is listed. Imports nothing of vLLM's: the wheel check reads it without vLLM.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from worker.vllm_internals.release import SUPPORTED, Release

__all__ = ["CONTRACT", "Internal", "Kind", "entries_for", "parse"]

Kind = Literal["class", "callable", "value"]


@dataclasses.dataclass(frozen=True, slots=True)
class Internal:
    module: str  # where vLLM defines it (or exports it, for its public names)
    name: str  # dotted within the module: "Scheduler", "Scheduler._free_request", "RequestStatus.RUNNING"
    kind: Kind
    uses: tuple[str, ...] = ()  # attributes (a class) or parameters (a callable)
    needed_by: str = ""  # the worker's module that relies on it
    releases: tuple[Release, ...] = SUPPORTED  # the releases it holds for (one: "0.34 only:")

    @property
    def qualified(self) -> str:
        return f"{self.module}.{self.name}"

    def failure(self, reason: str) -> str:
        """The sentence a broken entry fails with."""
        only = "" if self.releases == SUPPORTED else f"{' and '.join(self.releases)} only, "
        return f"{self.qualified} ({self.kind}, {only}needed by {self.needed_by}): {reason}"


_LINE = re.compile(
    r"^(?:(?P<release>\d+\.\d+) only: )?"
    r"(?P<module>[\w.]+):(?P<name>[\w.]+)(?:\{(?P<attrs>[^}]*)\}|\((?P<params>[^)]*)\))?$"
)


def parse(line: str, *, needed_by: str) -> Internal:
    """One entry of the table below (``module:name``, then ``{attributes}`` or ``(parameters)``;
    ``0.34 only:`` before it: an entry for that release alone)."""
    match = _LINE.match(line)
    if match is None:
        raise ValueError(f"not a contract entry: {line!r}")
    releases = SUPPORTED
    if match["release"] is not None:
        only = next((r for r in SUPPORTED if r == match["release"]), None)
        if only is None:
            raise ValueError(f"contract entry {line!r}: {match['release']} is not a release the seam spans")
        releases = (only,)
    attrs, params = match["attrs"], match["params"]
    kind: Kind = "class" if attrs is not None else "callable" if params is not None else "value"
    uses = tuple(u.strip() for u in (attrs or params or "").split(",") if u.strip())
    return Internal(match["module"], match["name"], kind, uses, needed_by, releases)


_STANDALONE = "vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator:StandaloneARSpeculator"

# The worker's module -> what it uses of vLLM's.
_TABLE: dict[str, tuple[str, ...]] = {
    "worker/vllm_internals/scheduler.py": (
        "vllm.v1.core.sched.scheduler:Scheduler{requests, running, vllm_config}",
        "vllm.v1.core.sched.scheduler:Scheduler.add_request(request)",
        "vllm.v1.core.sched.scheduler:Scheduler.update_from_output(scheduler_output, model_runner_output)",
        "vllm.v1.core.sched.scheduler:Scheduler.finish_requests(request_ids, finished_status)",
        "vllm.v1.core.sched.scheduler:Scheduler._free_request(request, delay_free_blocks)",
        "vllm.v1.core.sched.scheduler:Scheduler.has_requests()",
        "vllm.v1.core.sched.async_scheduler:AsyncScheduler{}",
        "vllm.v1.request:Request{request_id, sampling_params, spec_decode_metrics, status, client_index,"
        " spec_token_ids, num_output_tokens}",
        "vllm.v1.request:RequestStatus.RUNNING",
        "vllm.v1.request:RequestStatus.FINISHED_ABORTED",
        "vllm.v1.core.sched.output:SchedulerOutput{num_scheduled_tokens, scheduled_spec_decode_tokens,"
        " num_invalid_spec_tokens, num_spec_tokens_to_schedule, total_num_scheduled_tokens, scheduled_new_reqs}",
        "vllm.v1.outputs:ModelRunnerOutput{sampled_token_ids, req_ids}",
        "vllm.v1.engine:EngineCoreOutput{request_id, new_token_ids, kv_transfer_params, spec_decode_metrics}",
        "vllm.v1.engine:EngineCoreOutput(request_id, new_token_ids, kv_transfer_params)",
        "vllm.v1.engine:EngineCoreOutputs{outputs}",
        "vllm.v1.engine:EngineCoreOutputs(outputs)",
        "vllm.v1.metrics.stats:RequestSpecDecodeMetrics{num_spec_tokens, histogram, num_draft_tokens,"
        " per_step_accepted, per_step_drafted}",
        "vllm.v1.metrics.stats:RequestSpecDecodeMetrics(num_spec_tokens, histogram, num_draft_tokens,"
        " per_step_accepted, per_step_drafted)",
        "vllm.sampling_params:SamplingParams{stop, sampling_type, temperature}",
        "vllm.config:VllmConfig{speculative_config, scheduler_config}",
        "vllm.config.scheduler:SchedulerConfig{async_scheduling, scheduler_cls, max_num_seqs}",
        "vllm.config.speculative:SpeculativeConfig.uses_dynamic_speculative_decoding()",
    ),
    "worker/vllm_internals/frontend.py": (
        "vllm.v1.metrics.stats:RequestSpecDecodeMetrics.new(num_spec_tokens)",
        "vllm.v1.engine.output_processor:OutputProcessor{request_states, external_req_ids}",
        "vllm.v1.engine.output_processor:OutputProcessor.process_outputs(engine_core_outputs,"
        " engine_core_timestamp, iteration_stats, weight_version)",
        "vllm.v1.engine.output_processor:OutputProcessor._finish_request(req_state)",
        "vllm.v1.engine.output_processor:OutputProcessor.propagate_error(e)",
        "vllm.v1.engine.output_processor:OutputProcessorOutput{reqs_to_abort}",
        "vllm.v1.engine.output_processor:RequestOutputCollector{output, ready, put}",
        "vllm.v1.engine.output_processor:RequestOutputCollector.put(output)",
        "vllm.v1.engine.output_processor:RequestState{queue, parent_req, request_id, spec_decode_metrics}",
        "vllm.outputs:RequestOutput{outputs, finished, metrics, num_cached_tokens}",
        "vllm.outputs:CompletionOutput{spec_decode_metrics, finish_reason, stop_reason, token_ids, text}",
        "vllm.v1.metrics.stats:IterationStats{}",
        "vllm.v1.engine.async_llm:AsyncLLM{output_processor}",
    ),
    "worker/vllm_internals/scheduler_control.py": (
        "vllm.config.speculative:SpeculativeConfig{method, num_speculative_tokens,"
        " num_speculative_tokens_per_batch_size}",
        "vllm.v1.core.sched.scheduler:Scheduler{dynamic_sd_lookup, num_spec_tokens, running, requests}",
        "vllm.v1.core.sched.scheduler:Scheduler.schedule(throttle_prefills)",
        "vllm.config:VllmConfig{compilation_config, model_config, device_config}",
        "vllm.config.model:ModelConfig{enforce_eager}",
        "vllm.config.device:DeviceConfig{device_type}",
        "vllm.config.compilation:CompilationConfig{cudagraph_mode, cudagraph_capture_sizes,"
        " max_cudagraph_capture_size}",
        "vllm.config.compilation:CUDAGraphMode.has_full_cudagraphs()",
        "vllm.config.compilation:CUDAGraphMode.separate_routine()",
    ),
    "worker/speculation/stats/tracking.py": (
        "vllm.v1.metrics.stats:RequestStateStats{first_token_latency, queued_ts, scheduled_ts}",
    ),
    "worker/vllm_internals/stand_in.py": (
        "vllm.v1.request:Request(request_id, prompt_token_ids, sampling_params, pooling_params, client_index)",
        "vllm.v1.request:Request{max_tokens, is_finished, append_output_token_ids}",
        "vllm.v1.request:RequestStatus.FINISHED_LENGTH_CAPPED",
        "vllm.v1.engine:FinishReason.LENGTH",
        "vllm.v1.metrics.stats:RequestSpecDecodeMetrics.observe()",
        "vllm.v1.engine:EngineCoreOutput(finish_reason)",
    ),
    "worker/vllm_internals/async_llm.py": (
        "vllm.v1.engine.async_llm:AsyncLLM{engine_core, output_processor, renderer, vllm_config, model_config,"
        " errored}",
        "vllm.v1.engine.async_llm:AsyncLLM.from_vllm_config(vllm_config, disable_log_stats, usage_context,"
        " client_addresses, client_count, client_index)",
        "vllm.v1.engine.core_client:MPClient{resources}",
        "vllm.v1.engine.core_client:BackgroundResources{engine_dead}",
        "vllm.renderers.base:BaseRenderer.render_cmpl(prompts)",
        "vllm.platforms.interface:Platform.is_cpu()",
        "vllm.platforms:current_platform",
        "vllm.engine.arg_utils:AsyncEngineArgs{_api_process_count, _api_process_rank}",
        "vllm.usage.usage_lib:UsageContext.OPENAI_API_SERVER",
        "vllm:TokensPrompt",
        "vllm.v1.engine.exceptions:EngineDeadError",
        "vllm.v1.engine.exceptions:EngineGenerateError",
    ),
    "worker/boot/launch.py": (
        "vllm.v1.engine.async_llm:AsyncLLM{get_supported_tasks, add_lora, reset_prefix_cache}",
        "vllm.v1.engine.async_llm:AsyncLLM.from_vllm_config(vllm_config, disable_log_stats)",
        "vllm.engine.arg_utils:AsyncEngineArgs.create_engine_config(usage_context)",
        "vllm.usage.usage_lib:UsageContext.ENGINE_CONTEXT",
        "vllm.engine.arg_utils:AsyncEngineArgs{}",
    ),
    "worker/vllm_internals/plugin.py": (
        "vllm.config.compilation:CompilationConfig.resolve_cudagraph_mode_and_sizes(self, min_cg_support,"
        " min_cg_attn_backend)",
        "vllm.config.compilation:CUDAGraphMode.FULL",
        "vllm.config.compilation:CUDAGraphMode.FULL_AND_PIECEWISE",
        "vllm.config.compilation:CUDAGraphMode.FULL_DECODE_ONLY",
        "vllm.v1.attention.backend:AttentionCGSupport.NEVER",
        "vllm.v1.worker.gpu.cudagraph_utils:ModelCudaGraphManager{cudagraph_mode, _capture_descs, _candidates}",
        "vllm.v1.worker.gpu.cudagraph_utils:ModelCudaGraphManager._init_candidates(self)",
        "vllm.v1.worker.gpu.cudagraph_utils:BatchExecutionDescriptor{num_tokens, num_active_loras,"
        " uniform_token_count, max_query_len, num_ubatches}",
        "vllm.plugins:DEFAULT_PLUGINS_GROUP",
    ),
    "worker/vllm_internals/core_first.py": (
        "vllm.v1.engine.utils:bind_engine_zmq_listeners(vllm_config, num_api_servers)",
        "vllm.v1.engine.utils:EngineZmqListeners{addresses, cleanup, inputs, outputs}",
        "vllm.utils.network_utils:ZmqListener{address, socket}",
        "vllm.v1.engine.utils:launch_core_engines(vllm_config, executor_class, log_stats, addresses)",
        "vllm.v1.engine.utils:CoreEngineLaunch{engine_manager, tensor_queue}",
        "vllm.v1.engine.utils:CoreEngineProcManager{processes, shutdown}",
        "vllm.v1.executor.abstract:Executor.get_class(vllm_config)",
        "vllm.renderers:renderer_from_config(config)",
        "vllm.v1.engine.async_llm:renderer_from_config",
        "vllm.v1.engine.async_llm:AsyncLLM.from_vllm_config(vllm_config, usage_context, client_addresses,"
        " client_count, client_index)",
        "vllm.v1.engine.async_llm:AsyncLLM{engine_core}",
        "vllm.v1.engine.core_client:MPClient{resources, start_engine_core_monitor}",
        "vllm.v1.engine.core_client:BackgroundResources{engine_manager}",
        "vllm.usage.usage_lib:UsageContext.ENGINE_CONTEXT",
    ),
    "worker/vllm_internals/capture_heap.py": (
        "vllm.utils.gc_utils:freeze_gc_for_cudagraph_capture()",
        "vllm.v1.worker.gpu.model_runner:freeze_gc_for_cudagraph_capture",
        "vllm.envs:VLLM_ENABLE_CUDAGRAPH_GC",
    ),
    "worker/openai.py": (
        "vllm.v1.engine.async_llm:AsyncLLM{generate, vllm_config, model_config, get_supported_tasks}",
        "vllm.entrypoints.launchers.app:build_app(args, supported_tasks, model_config)",
        "vllm.entrypoints.launchers.api_server.app_state:init_app_state(engine_client, state, args, supported_tasks)",
        "vllm.utils.argparse_utils:FlexibleArgumentParser{parse_args}",
        "vllm.engine.protocol:EngineClient{}",
        "vllm.exceptions:VLLMValidationError(parameter)",
        "vllm.v1.engine.exceptions:EngineGenerateError",
    ),
    "worker/vllm_internals/openai_layer.py": (
        "vllm.entrypoints.serve.exception_handling.error_response:create_error_response(message)",
        "vllm.entrypoints.serve.engine.protocol:ErrorResponse{error}",
        "vllm.entrypoints.serve.engine.protocol:ErrorInfo{code}",
        "vllm.entrypoints.serve.exception_handling.handlers.http:http_exception_handler(req, exc)",
        "vllm.entrypoints.serve.exception_handling.handlers.validation:clean_loc_for_param(loc)",
    ),
    "worker/vllm_internals/api_processes.py": (
        "vllm.utils.system_utils:set_ulimit()",
        "vllm.utils.system_utils:decorate_logs()",
        "vllm.utils.system_utils:set_process_title(name, suffix)",
        "vllm.v1.engine.admission_control:SharedAdmissionStats(client_addresses, client_count, client_index)",
        "vllm.v1.engine.admission_control:SharedAdmissionStats.num_counters(client_count)",
        "vllm.v1.engine.utils:bind_engine_zmq_listeners(vllm_config, num_api_servers)",
        "vllm.v1.engine.utils:EngineZmqListeners{addresses, cleanup, inputs, outputs}",
        "vllm.v1.engine.utils:launch_core_engines(vllm_config, executor_class, log_stats, addresses)",
        "vllm.v1.engine.utils:CoreEngineLaunch{engine_manager, coordinator, tensor_queue, watched_frontend_processes}",
        "vllm.v1.engine.utils:CoreEngineProcManager.shutdown(timeout)",
        "vllm.v1.engine.coordinator:DPCoordinator.get_stats_publish_address()",
        "vllm.v1.executor.abstract:Executor.get_class(vllm_config)",
        "vllm.v1.metrics.prometheus:setup_multiprocess_prometheus()",
        "vllm.v1.utils:APIServerProcessManager(target_server_fn, listen_address, sock, args, num_servers,"
        " input_listeners, output_listeners, stats_update_address, tensor_queue)",
        "vllm.v1.utils:APIServerProcessManager{processes, shutdown}",
        "vllm.v1.utils:APIServerProcessManager.shutdown(timeout)",
        "vllm.v1.utils:wait_for_completion_or_failure(api_server_manager, engine_manager)",
        "vllm.entrypoints.launchers.launcher:NoSignalServer(config, peer_loads)",
    ),
    "worker/vllm_internals/media.py": (
        "vllm.connections:HTTPConnection{_async_client, reuse_client, get_async_client, get_response,"
        " get_async_response}",
        "vllm.connections:HTTPConnection.get_response(url)",
        "vllm.connections:HTTPConnection.get_async_response(url)",
        "vllm.multimodal.media:MEDIA_CONNECTOR_REGISTRY",
        "vllm.utils.registry:ExtensionManager.register(name)",
        "vllm.multimodal.media:MediaConnector{allowed_local_media_path}",
        "vllm.multimodal.media:MediaConnector(connection)",
        "vllm.multimodal.media:MediaConnector.load_from_url(url, media_io, fetch_timeout)",
        "vllm.multimodal.media:MediaConnector.load_from_url_async(url, media_io, fetch_timeout)",
    ),
    "worker/vllm_internals/variants.py": (
        # Where the two releases differ (the variants, side by side).
        "0.32 only: vllm.v1.outputs:ModelRunnerOutput{req_id_to_index}",
        "0.32 only: vllm.v1.core.sched.scheduler:Scheduler{use_v2_model_runner}",
        "0.32 only: vllm.entrypoints.launchers.cli_args:make_arg_parser(parser)",
        "0.34 only: vllm.entrypoints.common.cli_args:make_arg_parser(parser)",
        "0.34 only: vllm.v1.worker.gpu.spec_decode.standalone_ar.config:StandaloneARSpeculatorConfig{speculator_class}",
        "vllm.platforms:current_platform",
        "vllm.utils.argparse_utils:FlexibleArgumentParser()",
    ),
    "worker/vllm_internals/draft_skip.py": (
        # The draft model's pass skipped at k = 0 and its KV caught up (vLLM 0.34's V2 speculator).
        f"0.34 only: {_STANDALONE}{{max_num_reqs, max_num_tokens, dp_size, dcp_size, draft_tokens, block_tables,"
        " attn_groups, kv_cache_config, device}",
        f"0.34 only: {_STANDALONE}(vllm_config, device)",
        f"0.34 only: {_STANDALONE}.propose(input_batch, num_speculative_tokens, dummy_run, is_profile)",
        f"0.34 only: {_STANDALONE}.add_request(req_index)",
        f"0.34 only: {_STANDALONE}._run_model(input_ids, positions, attn_metadata, slot_mappings,"
        " num_tokens_across_dp, cudagraph_runtime_mode)",
        "0.34 only: vllm.v1.worker.gpu.spec_decode:init_speculator(vllm_config, device, req_states)",
        "0.34 only: vllm.v1.worker.gpu.states:RequestState{all_token_ids, num_computed_tokens_np, index_to_req_id}",
        "0.34 only: vllm.v1.worker.gpu.buffer_utils:StagedWriteTensor{gpu}",
        "0.34 only: vllm.v1.worker.gpu.block_table:BlockTables{block_tables, cp_size}",
        f"0.34 only: {_STANDALONE}{{expanded_slot_mappings}}",
        "vllm.v1.kv_cache_interface:FullAttentionSpec",
        "vllm.config:VllmConfig{kv_transfer_config}",
        "0.34 only: vllm.v1.worker.gpu.block_table:BlockTables.compute_slot_mappings(idx_mapping, query_start_loc,"
        " positions, num_tokens_padded, out)",
        "0.34 only: vllm.v1.worker.gpu.attn_utils:build_attn_metadata(attn_groups, num_reqs, num_tokens,"
        " query_start_loc_gpu, query_start_loc_cpu, max_query_len, seq_lens, max_seq_len, block_tables,"
        " slot_mappings, kv_cache_config, seq_lens_cpu_upper_bound, positions, is_prefilling)",
        "0.34 only: vllm.v1.worker.gpu.attn_utils:build_slot_mappings_by_layer(slot_mappings, kv_cache_config)",
        "0.34 only: vllm.v1.worker.gpu.input_batch:InputBatch{num_reqs, idx_mapping, idx_mapping_np, positions,"
        " query_start_loc}",
        "vllm.config.compilation:CUDAGraphMode.NONE",
        "vllm.config.cache:CacheConfig{enable_prefix_caching}",
        "vllm.config:VllmConfig{cache_config}",
    ),
    "worker/vllm_internals/modelinfo.py": (
        "vllm.model_executor.models.registry:ModelRegistry",
        "vllm.model_executor.models.registry:_ModelRegistry{models}",
        "vllm.model_executor.models.registry:_LazyRegisteredModel{module_name, load_model_cls,"
        " _get_modelinfo_module_hash, _load_modelinfo_from_cache, _save_modelinfo_to_cache, _get_cache_filename}",
        "vllm.model_executor.models.registry:_LazyRegisteredModel._get_modelinfo_module_hash(model_path)",
        "vllm.model_executor.models.registry:_LazyRegisteredModel._load_modelinfo_from_cache(module_hash)",
        "vllm.model_executor.models.registry:_LazyRegisteredModel._save_modelinfo_to_cache(mi, module_hash)",
        "vllm.model_executor.models.registry:_LazyRegisteredModel._get_cache_filename()",
        "vllm.model_executor.models.registry:_ModelInfo.from_model_cls(model)",
    ),
    "worker/media.py": ("vllm.exceptions:VLLMValidationError{}",),
    "worker/vllm_internals/config_fields.py": (
        "vllm.engine.arg_utils:AsyncEngineArgs{}",
        "vllm.config.speculative:SpeculativeConfig{}",
    ),
    # vLLM's derivation that model_len.py writes out (tests/test_model_len.py runs both side by side).
    "worker/vllm_internals/model_len.py": (
        "vllm.config.model:_get_and_verify_max_len(hf_config, model_arch_config, tokenizer_config, max_model_len,"
        " disable_sliding_window, sliding_window)",
        "vllm.transformers_utils.model_arch_config_convertor:ModelArchConfigConvertorBase"
        ".derive_max_model_len_and_key()",
        "vllm.transformers_utils.model_arch_config_convertor:MODEL_ARCH_CONFIG_CONVERTORS",
    ),
    "worker/engine.py": (
        "vllm.v1.engine.async_llm:AsyncLLM{get_tokenizer, generate, shutdown}",
        "vllm.v1.engine.async_llm:AsyncLLM{vllm_config, errored, get_num_unfinished_requests}",
        "vllm.v1.engine.async_llm:AsyncLLM.generate(prompt, sampling_params, request_id, lora_request)",
        "vllm.config.model:ModelConfig{max_model_len, quantization, model, get_diff_sampling_param}",
        "vllm:SamplingParams",
        "vllm.exceptions:VLLMClientError",
        "vllm.lora.request:LoRARequest(lora_name, lora_int_id, lora_path)",
        "vllm.sampling_params:RequestOutputKind.DELTA",
        "vllm.sampling_params:SamplingType.GREEDY",
        "vllm.sampling_params:StructuredOutputsParams(json, json_object, regex, choice, grammar)",
    ),
    # The bench's probes (worker/vllm_internals/probes.py) and what the bench reads of vLLM's public objects.
    "worker/vllm_internals/probes.py": (
        "vllm.v1.core.sched.scheduler:Scheduler.update_from_output(scheduler_output, model_runner_output)",
        "vllm.v1.core.sched.output:SchedulerOutput{num_scheduled_tokens, scheduled_spec_decode_tokens,"
        " num_spec_tokens_to_schedule, total_num_scheduled_tokens, scheduled_new_reqs}",
        "vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler{enable_adaptive_verification}",
        "vllm.v1.worker.gpu.input_batch:InputBatch{req_ids, cu_num_logits_np}",
        "vllm.utils.torch_utils:async_tensor_h2d(data, device)",
        "0.32 only: vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler.__call__(logits, input_batch,"
        " draft_logits, invalid_drafts)",
        "0.34 only: vllm.v1.worker.gpu.spec_decode.rejection_sampler:RejectionSampler.__call__(logits, input_batch,"
        " draft_logits)",
        "0.34 only: vllm.v1.worker.gpu.spec_decode.rejection_sampler:rejection_sample(target_logits,"
        " draft_logits_cache, draft_sampled)",
        "0.32 only: vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose(num_speculative_tokens)",
        "0.32 only: vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"
        "._determine_batch_execution_and_padding(num_tokens)",
        "0.32 only: vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model()",
        "vllm.v1.serial_utils:MsgpackEncoder()",
        "vllm.v1.serial_utils:MsgpackEncoder.encode(obj)",
        "vllm.v1.serial_utils:MsgpackDecoder(t)",
        "vllm.v1.serial_utils:MsgpackDecoder.decode(bufs)",
        "vllm.v1.engine:EngineCoreOutputs(engine_index, outputs)",
    ),
    "worker/tools/bench/draft_step.py": (
        "vllm:LLM{generate}",
        "vllm:LLM.generate(prompts, sampling_params, use_tqdm)",
    ),
    "worker/tools/bench/overhead.py": (
        "vllm.v1.engine.async_llm:AsyncLLM{generate, vllm_config}",
        "vllm.config:VllmConfig{scheduler_config}",
        "vllm.config.scheduler:SchedulerConfig{stream_interval}",
    ),
    "worker/tools/bench/lossless.py": (
        "vllm.v1.engine.async_llm:AsyncLLM{generate, get_tokenizer}",
        "vllm:TokensPrompt",
    ),
    "worker/tools/bench/pause_acceptance.py": ("vllm.v1.engine.async_llm:AsyncLLM{get_tokenizer, generate}",),
}

CONTRACT: tuple[Internal, ...] = tuple(parse(line, needed_by=by) for by, lines in _TABLE.items() for line in lines)
"""Every entry, of every release."""


def entries_for(release: Release) -> tuple[Internal, ...]:
    """The entries that hold for ``release``: those of every release, and its own."""
    return tuple(entry for entry in CONTRACT if release in entry.releases)
