<?xml version="1.0" encoding="utf-8"?>
<!DOCTYPE TS>
<TS version="2.1" language="zh_CN" sourcelanguage="en">
  <context>
    <name>Merlin</name>
    <message>
      <location filename="../../app/context_meter.py" />
      <source>{n} / {budget} tokens</source>
      <translation>{n} / {budget} 个词元</translation>
    </message>
    <message>
      <location filename="../../app/context_meter.py" />
      <source>If you send now, the model sees {n} tokens: the conversation in context and your message. The context budget is {budget} tokens (Settings); {reserve} of them are kept free for the answer.</source>
      <translation>现在发送，模型将看到 {n} 个词元：上下文中的对话和您的消息。上下文预算为 {budget} 个词元（见设置），其中 {reserve} 个留给回答。</translation>
    </message>
    <message>
      <location filename="../../app/context_meter.py" />
      <source>The attached pictures take {n} tokens.</source>
      <translation>附加的图片占 {n} 个词元。</translation>
    </message>
    <message>
      <location filename="../../app/context_meter.py" />
      <source>{n} older message(s) are left out to make room; they stay in the chat.</source>
      <translation>为腾出空间，{n} 条较早的消息未发送给模型；它们仍保留在聊天中。</translation>
    </message>
    <message>
      <location filename="../../app/context_meter.py" />
      <source>Nearly full: older messages will soon be left out.</source>
      <translation>即将用满：较早的消息很快将不再发送给模型。</translation>
    </message>
    <message>
      <location filename="../../app/context_meter.py" />
      <source>This message cannot be sent as it is: {why}</source>
      <translation>此消息无法按原样发送：{why}</translation>
    </message>
    <message>
      <location filename="../../app/image_encoding.py" />
      <source>{n} tokens, about {s} s to read</source>
      <translation>{n} 个令牌，读取约需 {s} 秒</translation>
    </message>
    <message>
      <location filename="../../app/image_encoding.py" />
      <source>{n} tokens, reading {d}/{depth}</source>
      <translation>{n} 个令牌，正在读取 {d}/{depth}</translation>
    </message>
    <message>
      <location filename="../../app/image_encoding.py" />
      <source>{n} tokens, read in {s} s</source>
      <translation>{n} 个令牌，已用 {s} 秒读取</translation>
    </message>
    <message>
      <location filename="../../app/image_encoding.py" />
      <source>waiting to read…</source>
      <translation>等待读取…</translation>
    </message>
    <message>
      <location filename="../../app/image_encoding.py" />
      <source>blocks {d}/{depth}</source>
      <translation>块 {d}/{depth}</translation>
    </message>
    <message>
      <location filename="../../app/image_encoding.py" />
      <source>stopped</source>
      <translation>已停止</translation>
    </message>
    <message>
      <location filename="../../app/model/branching.py" />
      <source>The chat store failed: {why}</source>
      <translation>聊天存储出错：{why}</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>Loading was cancelled; the previous model stays.</source>
      <translation>已取消加载；继续使用之前的模型。</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>Loading was cancelled; no model is loaded.</source>
      <translation>已取消加载；当前没有加载模型。</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>Your message is saved and will be answered when the model is ready.</source>
      <translation>你的消息已保存，模型就绪后将会回答。</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>This message cannot be sent: {why}</source>
      <translation>无法发送此消息：{why}</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>This chat was deleted in another window; your message starts a new one.</source>
      <translation>此对话已在另一个窗口中删除；你的消息将开始一个新对话。</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>Your message could not be saved ({why}); it is still in the box below.</source>
      <translation>无法保存你的消息（{why}）；它仍在下方的输入框中。</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>The answer failed: {why}</source>
      <translation>回答失败：{why}</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>The engine stopped without finishing the answer.</source>
      <translation>引擎在回答完成前停止了。</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>The answer could not be saved: {why}</source>
      <translation>无法保存回答：{why}</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>This chat's session was not saved for quick continuation: {why}</source>
      <translation>此对话的会话未保存，下次继续时需要重新计算：{why}</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>The chat was not renamed: {why}</source>
      <translation>对话未重命名：{why}</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>The chat was not deleted: {why}</source>
      <translation>对话未删除：{why}</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>The conversation no longer fits in the context budget: the {n} oldest message(s) are left out of what the model sees (they stay in the chat).</source>
      <translation>对话已超出上下文预算：最早的 {n} 条消息不再提供给模型（它们仍保留在对话中）。</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>Image chat</source>
      <translation>图片对话</translation>
    </message>
    <message>
      <location filename="../../app/model/conversation.py" />
      <source>New chat</source>
      <translation>新对话</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Mon</source>
      <translation>周一</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Tue</source>
      <translation>周二</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Wed</source>
      <translation>周三</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Thu</source>
      <translation>周四</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Fri</source>
      <translation>周五</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Sat</source>
      <translation>周六</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Sun</source>
      <translation>周日</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Jan</source>
      <translation>1月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Feb</source>
      <translation>2月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Mar</source>
      <translation>3月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Apr</source>
      <translation>4月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>May</source>
      <translation>5月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Jun</source>
      <translation>6月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Jul</source>
      <translation>7月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Aug</source>
      <translation>8月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Sep</source>
      <translation>9月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Oct</source>
      <translation>10月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Nov</source>
      <translation>11月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Dec</source>
      <translation>12月</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Today {time}</source>
      <translation>今天 {time}</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>Yesterday</source>
      <translation>昨天</translation>
    </message>
    <message>
      <location filename="../../app/model/dates.py" />
      <source>{day} {month} {year}</source>
      <translation>{year}年{month}{day}日</translation>
    </message>
    <message>
      <location filename="../../app/model/history.py" />
      <source>Some images of earlier messages can no longer be read ({names}); the model answers without them.</source>
      <translation>之前消息中的部分图片已无法读取（{names}）；模型将在没有这些图片的情况下回答。</translation>
    </message>
    <message>
      <location filename="../../app/model/thought.py" />
      <source>Thinking… {n} s</source>
      <translation>思考中… {n} 秒</translation>
    </message>
    <message>
      <location filename="../../app/model/thought.py" />
      <source>Thought for {n} s</source>
      <translation>已思考 {n} 秒</translation>
    </message>
    <message>
      <location filename="../../app/model/thought.py" />
      <source>Load a model first.</source>
      <translation>请先加载模型。</translation>
    </message>
    <message>
      <location filename="../../app/model/thought.py" />
      <source>This model's chat template has no thinking mode, so it always answers directly. Load a -Thinking checkpoint to see its reasoning.</source>
      <translation>此模型的对话模板没有思考模式，因此总是直接回答。加载 -Thinking 检查点即可看到它的推理过程。</translation>
    </message>
    <message>
      <location filename="../../app/model/thought.py" />
      <source>The model thinks before it answers (its reasoning shows above the answer).</source>
      <translation>模型先思考再回答（推理过程显示在回答上方）。</translation>
    </message>
    <message>
      <location filename="../../app/model/thought.py" />
      <source>This model always thinks; switched off, Merlin closes its thinking block at once so it answers directly.</source>
      <translation>此模型总是先思考；关闭后，Merlin 会立即结束它的思考块，让它直接回答。</translation>
    </message>
    <message>
      <location filename="../../app/remote_settings.py" />
      <source>Remote server: time to first token, tokens/s and tokens in/out are measured from its stream and usage. The GEMM/attention split and speculative statistics are not available remotely.</source>
      <translation>远程服务器：首词元时间、词元/秒以及输入/输出词元数取自其数据流和用量统计。远程模式下无法获得 GEMM/注意力耗时拆分和推测解码统计。</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>{why} Kept: {n}.</source>
      <translation>{why} 已保留：{n}。</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Settings</source>
      <translation>设置</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Answers</source>
      <translation>回答</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Application</source>
      <translation>应用程序</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Preset</source>
      <translation>预设</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>System prompt</source>
      <translation>系统提示词</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Sampling</source>
      <translation>采样</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Temperature (0 = greedy)</source>
      <translation>温度（0 = 贪心）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Top-p</source>
      <translation>Top-p</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Top-k (0 = off)</source>
      <translation>Top-k（0 = 关闭）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Min-p</source>
      <translation>Min-p</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Repetition penalty</source>
      <translation>重复惩罚</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Max new tokens</source>
      <translation>最大新词元数</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Context budget (tokens, 0 = model maximum)</source>
      <translation>上下文预算（词元，0 = 模型最大值）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Threads (0 = all cores)</source>
      <translation>线程数（0 = 全部核心）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Speculative decoding</source>
      <translation>推测解码</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Draft tokens K</source>
      <translation>草稿词元数 K</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Thinking budget (reasoning tokens, 0 = no limit)</source>
      <translation>思考预算（推理 token 数，0 = 不限）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Image max pixels (0 = model default; used when image tokens is 0)</source>
      <translation>图像最大像素（0 = 模型默认；图像令牌为 0 时使用）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Image tokens per image (0 = this machine's default)</source>
      <translation>每张图像的令牌数（0 = 本机默认）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Language</source>
      <translation>语言</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>CPUs: big, all or a list like 0-3 (at the next start)</source>
      <translation>CPU：big（大核）、all（全部）或列表如 0-3（下次启动生效）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Disk for saved sessions (MB, 0 = do not save)</source>
      <translation>已保存会话的磁盘上限（MB，0 = 不保存）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Mixture-of-experts weights: keep the experts memory-mapped from the weight cache (at the next model load)</source>
      <translation>混合专家模型权重：专家保持从权重缓存内存映射（下次加载模型时生效）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Use the model's recommended values</source>
      <translation>使用模型推荐的值</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>this machine's default ({n})</source>
      <translation>本机默认（{n}）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>no limit</source>
      <translation>不限</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>For thinking models: after this many reasoning tokens Merlin closes the thinking block and the model answers.</source>
      <translation>用于思考模型：推理达到这么多 token 后，Merlin 结束思考块，模型开始回答。</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>System language</source>
      <translation>系统语言</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Auto (only when the model would not fit in memory)</source>
      <translation>自动（仅当模型装不进内存时）</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Always</source>
      <translation>总是</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Never</source>
      <translation>从不</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>For mixture-of-experts models (such as Qwen3-30B-A3B) with q8 or q4 weights. Memory-mapped experts stay in the converted weights on disk and are read as tokens need them, so a model larger than the memory still runs, slower on a slow disk.
Auto: mapped only when the model would not fit in the memory available otherwise.
Always: mapped at every load; the least memory in use.
Never: always copied into memory; a model that does not fit is refused.
Applies at the next model load.</source>
      <translation>用于 q8 或 q4 权重的混合专家模型（如 Qwen3-30B-A3B）。内存映射的专家留在磁盘上转换后的权重中，词元需要时才读取，因此比内存更大的模型也能运行，磁盘慢时会更慢。
自动：仅当模型不映射就装不进可用内存时才映射。
总是：每次加载都映射；占用内存最少。
从不：总是复制到内存中；装不下的模型会被拒绝。
下次加载模型时生效。</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>off</source>
      <translation>关</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>on</source>
      <translation>开</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>auto</source>
      <translation>自动</translation>
    </message>
    <message>
      <location filename="../../app/settings.py" />
      <source>Saved sessions use {size} in {n} file(s) ({folder}).</source>
      <translation>已保存的会话占用 {size}，共 {n} 个文件（{folder}）。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} was not attached: {why}</source>
      <translation>{name} 未附加：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} is a folder, not an image.</source>
      <translation>{name} 是文件夹，不是图片。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} cannot be found.</source>
      <translation>找不到 {name}。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} is not a regular file (a pipe or a device); it was not attached.</source>
      <translation>{name} 不是普通文件（是管道或设备），未添加为附件。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} is larger than {mb} MB; attach a smaller image.</source>
      <translation>{name} 大于 {mb} MB，请附加更小的图片。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} cannot be read ({why}); it was not attached.</source>
      <translation>无法读取 {name}（{why}）；未添加。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} is damaged or not really an image; it was not attached.</source>
      <translation>{name} 已损坏或并不是图片，未附加。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} is not an image Merlin can use. Attach PNG, JPEG, WebP, GIF, BMP or TIFF.</source>
      <translation>{name} 不是 Merlin 能使用的图片。请附加 PNG、JPEG、WebP、GIF、BMP 或 TIFF。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} is {w}x{h} pixels, too large to open safely. Scale it down first.</source>
      <translation>{name} 为 {w}x{h} 像素，太大，无法安全打开。请先缩小。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} is only {w}x{h} pixels; there is nothing to see.</source>
      <translation>{name} 只有 {w}x{h} 像素，没有可看的内容。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} could not be read ({why}); it was not attached.</source>
      <translation>无法读取 {name}（{why}），未附加。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>{name} could not be converted to PNG ({why}); it was not attached.</source>
      <translation>{name} 无法转换为 PNG（{why}），未添加为附件。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>The pasted image could not be saved ({why}).</source>
      <translation>无法保存粘贴的图片（{why}）。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/attachments.py" />
      <source>The pasted image could not be saved.</source>
      <translation>无法保存粘贴的图片。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/banner.py" />
      <source>Dismiss</source>
      <translation>关闭</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Open a chat to export it.</source>
      <translation>请先打开一个对话再导出。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Export chat</source>
      <translation>导出对话</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>The chat was not exported: {why}</source>
      <translation>对话未导出：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Exported to {path}</source>
      <translation>已导出到 {path}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>There are no chats to export yet.</source>
      <translation>还没有可导出的对话。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Export all chats</source>
      <translation>导出全部对话</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>The chats were not exported: {why}</source>
      <translation>对话未导出：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Exported {n} chats to {path}</source>
      <translation>已将 {n} 个对话导出到 {path}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Import chats</source>
      <translation>导入对话</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Nothing was imported: {why}</source>
      <translation>未导入任何内容：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Imported {n} chats from {path}</source>
      <translation>已从 {path} 导入 {n} 个对话</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>{n} pictures were already missing when the chats were exported; they are left out.</source>
      <translation>{n} 张图片在导出时就已缺失，已略去。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Importing chats from {path}…</source>
      <translation>正在从 {path} 导入对话…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Open a chat to copy it.</source>
      <translation>请先打开一个对话再复制。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>The chat was not copied: {why}</source>
      <translation>对话未复制：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>{path} already exists; nothing was exported. Choose another name.</source>
      <translation>{path} 已存在；未导出任何内容。请换一个文件名。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>Exporting to {path}…</source>
      <translation>正在导出到 {path}…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_files.py" />
      <source>An import or export is still running; wait for it.</source>
      <translation>导入或导出仍在进行，请等待其完成。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>[image missing]</source>
      <translation>[图片缺失]</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>Tinted text came from accepted speculative drafts.</source>
      <translation>着色的文字来自被接受的推测解码草稿。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>{n} tokens</source>
      <translation>{n} 个词元</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>{rate:.1f} tokens/s</source>
      <translation>{rate:.1f} 词元/秒</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>writing…</source>
      <translation>正在生成…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>interrupted (Merlin was closed while answering)</source>
      <translation>已中断（回答时 Merlin 被关闭）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>failed</source>
      <translation>失败</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>waiting for the model to load</source>
      <translation>等待模型加载</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>the context budget is full</source>
      <translation>上下文预算已满</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>You</source>
      <translation>你</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>Merlin</source>
      <translation>Merlin</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>Copy message</source>
      <translation>复制消息</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>Edit and run again from here</source>
      <translation>编辑并从此处重新运行</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>Regenerate this answer</source>
      <translation>重新生成此回答</translation>
    </message>
    <message>
      <location filename="../../app/widgets/chat_view.py" />
      <source>Drop an image here or type a question below.
Merlin answers on this computer.</source>
      <translation>将图片拖到这里，或在下方输入问题。
Merlin 在这台电脑上回答。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Remove {name}</source>
      <translation>移除 {name}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>default</source>
      <translation>默认</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>fast</source>
      <translation>快速</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>detailed</source>
      <translation>详细</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>full</source>
      <translation>完整</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>detail: {name}</source>
      <translation>细节：{name}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>How many image tokens this picture may become</source>
      <translation>这张图片最多可变为多少个图像令牌</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Merlin is still answering; press Stop or wait.</source>
      <translation>Merlin 仍在回答；请按“停止”或稍候。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Sending once the images are read…</source>
      <translation>图片读取完成后发送…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Stop</source>
      <translation>停止</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Send</source>
      <translation>发送</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Stop the answer (Esc)</source>
      <translation>停止回答（Esc）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Send (Enter)</source>
      <translation>发送（Enter）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Attach images</source>
      <translation>附加图片</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Images</source>
      <translation>图片</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>All files</source>
      <translation>所有文件</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>At most {n} images per message.</source>
      <translation>每条消息最多 {n} 张图片。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>The clipboard image is empty.</source>
      <translation>剪贴板中的图片为空。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>pasted image</source>
      <translation>粘贴的图片</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>The image could not be read: {why}</source>
      <translation>无法读取图片：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Reading the image…</source>
      <translation>正在读取图片…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Only files on this computer can be attached.</source>
      <translation>只能附加这台电脑上的文件。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Ask about an image, or anything…</source>
      <translation>询问图片，或任何问题…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Attach images (or drop them, or paste)</source>
      <translation>附加图片（也可拖放或粘贴）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Enter sends · Shift+Enter new line · Esc stops</source>
      <translation>Enter 发送 · Shift+Enter 换行 · Esc 停止</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Editing an earlier message: sending replaces it and everything after it.</source>
      <translation>正在编辑之前的消息：发送后将替换它及其后的所有内容。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/composer.py" />
      <source>Cancel edit</source>
      <translation>取消编辑</translation>
    </message>
    <message>
      <location filename="../../app/widgets/conversations.py" />
      <source>No chat matches “{text}”.</source>
      <translation>没有与“{text}”匹配的对话。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/conversations.py" />
      <source>No chats yet: ask something to start one.</source>
      <translation>还没有对话：提个问题即可开始。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/conversations.py" />
      <source>Rename</source>
      <translation>重命名</translation>
    </message>
    <message>
      <location filename="../../app/widgets/conversations.py" />
      <source>Delete</source>
      <translation>删除</translation>
    </message>
    <message>
      <location filename="../../app/widgets/conversations.py" />
      <source>Search chats</source>
      <translation>搜索对话</translation>
    </message>
    <message>
      <location filename="../../app/widgets/conversations.py" />
      <source>New chat (Ctrl+N)</source>
      <translation>新对话（Ctrl+N）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Get a model</source>
      <translation>获取模型</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Checkpoints Merlin supports. Memory is what loading needs with an 8,192-token context and a picture; weights are converted on the first load. Downloads go to {folder} and resume if they stop.</source>
      <translation>Merlin 支持的检查点。内存是在 8,192 词元上下文并带一张图片时加载所需的量；权重在首次加载时转换。下载保存到 {folder}，中断后可继续。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Model</source>
      <translation>模型</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Memory q4</source>
      <translation>内存 q4</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Memory q8</source>
      <translation>内存 q8</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Here</source>
      <translation>本机</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Hugging Face hub</source>
      <translation>Hugging Face hub</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>A mirror of the hub</source>
      <translation>hub 的镜像</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>ModelScope</source>
      <translation>ModelScope（魔搭）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Install the modelscope package to download from ModelScope.</source>
      <translation>安装 modelscope 软件包后即可从 ModelScope 下载。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>From</source>
      <translation>来源</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Mirror address</source>
      <translation>镜像地址</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Download</source>
      <translation>下载</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Cancel download</source>
      <translation>取消下载</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>(too big here)</source>
      <translation>（本机内存不足）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>partly</source>
      <translation>未完成</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>downloaded</source>
      <translation>已下载</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Enter the mirror's address, e.g. {example}</source>
      <translation>请输入镜像地址，例如 {example}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Downloading {name}…</source>
      <translation>正在下载 {name}…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>The download failed: {why}</source>
      <translation>下载失败：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Stopping the download…</source>
      <translation>正在停止下载…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>{file}: {done} of {total}</source>
      <translation>{file}：{done} / {total}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/get_model_dialog.py" />
      <source>Downloaded to {folder}</source>
      <translation>已下载到 {folder}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/message_text.py" />
      <source>Copy code</source>
      <translation>复制代码</translation>
    </message>
    <message>
      <location filename="../../app/widgets/message_text.py" />
      <source>Copy code block</source>
      <translation>复制代码块</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>{folder} is not a folder.</source>
      <translation>{folder} 不是文件夹。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>The download into {folder} is not finished; open Get a model… to resume it.</source>
      <translation>{folder} 的下载尚未完成；请打开“获取模型…”继续下载。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>{folder} has no config.json, so it is not a Hugging Face checkpoint folder. Choose the folder that holds config.json and the .safetensors files.</source>
      <translation>{folder} 中没有 config.json，因此不是 Hugging Face 检查点文件夹。请选择包含 config.json 和 .safetensors 文件的文件夹。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>{folder} is not a checkpoint Merlin runs (Qwen3-VL, Qwen3-VL-MoE or Qwen3-MoE: see config.json).</source>
      <translation>{folder} 不是 Merlin 能运行的模型（Qwen3-VL、Qwen3-VL-MoE 或 Qwen3-MoE：见 config.json）。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Load a model</source>
      <translation>加载模型</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Choose a Qwen3-VL checkpoint. Converted weights are cached, so the next start is faster.</source>
      <translation>选择一个 Qwen3-VL 检查点。转换后的权重会被缓存，下次启动更快。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Demo model (tiny, trained on pictures of shapes)</source>
      <translation>演示模型（很小，用形状图片训练）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Qwen3-VL-2B shapes with random weights (real-size speed figures; built once, 4.3 GB)</source>
      <translation>Qwen3-VL-2B 尺寸的随机权重模型（真实规模的速度数据；只构建一次，4.3 GB）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>(incomplete download)</source>
      <translation>（下载不完整）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>OpenAI-compatible server (vLLM, llama-server, merlin-cli serve…)</source>
      <translation>OpenAI 兼容服务器（vLLM、llama-server、merlin-cli serve…）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Choose a folder…</source>
      <translation>选择文件夹…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Get a model…</source>
      <translation>获取模型…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>auto (q4 or q8, whichever runs faster on this CPU)</source>
      <translation>自动（q4 或 q8，取在此 CPU 上更快的一种）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>f32 (exact, 4 bytes per weight)</source>
      <translation>f32（精确，每个权重 4 字节）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>q8 (1.06 bytes per weight)</source>
      <translation>q8（每个权重 1.06 字节）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>q4 (0.56 bytes per weight, fastest)</source>
      <translation>q4（每个权重 0.56 字节，最快）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>f32 (exact)</source>
      <translation>f32（精确）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>q8 (a quarter of the memory)</source>
      <translation>q8（四分之一内存）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Weights</source>
      <translation>权重</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>KV cache</source>
      <translation>KV 缓存</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Load</source>
      <translation>加载</translation>
    </message>
    <message>
      <location filename="../../app/widgets/model_dialog.py" />
      <source>Checkpoint folder</source>
      <translation>检查点文件夹</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>ms per forward · last {n}</source>
      <translation>每次前向的毫秒数 · 最近 {n} 次</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>GEMM</source>
      <translation>GEMM</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>attention</source>
      <translation>注意力</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>other</source>
      <translation>其他</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Ask something to see where the time goes.</source>
      <translation>提个问题，看看时间花在哪里。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>{ms} · computed {n} / reused {r} tok</source>
      <translation>{ms} · 计算 {n} / 复用 {r} 词元</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>chart repaint {avg:.2f} ms (max {peak:.2f} ms)</source>
      <translation>图表重绘 {avg:.2f} 毫秒（最长 {peak:.2f} 毫秒）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Performance</source>
      <translation>性能</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Tokens/s (now / avg)</source>
      <translation>词元/秒（当前 / 平均）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Time to first token</source>
      <translation>首词元时间</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Vision encoder</source>
      <translation>视觉编码器</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Prefill</source>
      <translation>预填充</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Context (tokens)</source>
      <translation>上下文（词元）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>KV cache memory</source>
      <translation>KV 缓存内存</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Memory</source>
      <translation>内存</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>GEMM / attention / other</source>
      <translation>GEMM / 注意力 / 其他</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Weights + KV read</source>
      <translation>权重 + KV 读取</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Experts / weights read per forward</source>
      <translation>每次前向读取的专家 / 权重</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Mode</source>
      <translation>模式</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Tries (drafted)</source>
      <translation>尝试次数（草稿数）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Accepted drafts</source>
      <translation>接受的草稿</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>KV rollbacks</source>
      <translation>KV 回滚</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Hit rate</source>
      <translation>命中率</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>Tokens per forward</source>
      <translation>每次前向的词元数</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>{rss} of {ram}</source>
      <translation>{rss} / {ram}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/perf_panel.py" />
      <source>{memory}; KV {kv}</source>
      <translation>{memory}；KV {kv}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Default</source>
      <translation>默认</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Concise</source>
      <translation>简洁</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Describe pictures in detail</source>
      <translation>详细描述图片</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Step by step</source>
      <translation>逐步思考</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Answer in Chinese</source>
      <translation>用中文回答</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Save as preset…</source>
      <translation>另存为预设…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Delete preset</source>
      <translation>删除预设</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Save as preset</source>
      <translation>另存为预设</translation>
    </message>
    <message>
      <location filename="../../app/widgets/preset_picker.py" />
      <source>Preset name</source>
      <translation>预设名称</translation>
    </message>
    <message>
      <location filename="../../app/widgets/reasoning_block.py" />
      <source>Hide the reasoning</source>
      <translation>隐藏推理过程</translation>
    </message>
    <message>
      <location filename="../../app/widgets/reasoning_block.py" />
      <source>Show the reasoning</source>
      <translation>显示推理过程</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>OpenAI-compatible server</source>
      <translation>OpenAI 兼容服务器</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>(none)</source>
      <translation>（无）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>Fetch models</source>
      <translation>获取模型列表</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>Address</source>
      <translation>地址</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>API key</source>
      <translation>API 密钥</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>Answers come from that server: the panel shows time to first token, tokens/s and tokens in/out; the GEMM/attention split and speculative statistics are not available remotely. The key is kept in a file of its own, not with the chats.</source>
      <translation>回答来自该服务器：面板显示首词元时间、词元/秒以及输入/输出词元数；远程模式下无法获得 GEMM/注意力耗时拆分和推测解码统计。密钥单独保存在一个文件中，不与对话存放在一起。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>Asking the server…</source>
      <translation>正在询问服务器…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/remote_dialog.py" />
      <source>{n} model(s) on the server.</source>
      <translation>服务器上有 {n} 个模型。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Serve to other apps</source>
      <translation>提供给其他应用</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Only this computer (127.0.0.1)</source>
      <translation>仅本机 (127.0.0.1)</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Other devices on the network (needs an API key)</source>
      <translation>网络中的其他设备（需要 API 密钥）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>(generated when needed)</source>
      <translation>（需要时自动生成）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Other programs (Open WebUI, editors, scripts) can then use the loaded model through the OpenAI API at the address shown. Their requests take turns with your own questions.</source>
      <translation>其他程序（Open WebUI、编辑器、脚本）随后可以通过所示地址的 OpenAI API 使用已加载的模型。它们的请求与你自己的提问轮流进行。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Port</source>
      <translation>端口</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Serve</source>
      <translation>开始提供</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Load a model first; then it can be served.</source>
      <translation>请先加载模型，然后才能提供服务。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source> Clients send the API key {key}.</source>
      <translation> 客户端需发送 API 密钥 {key}。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Serving the model to other apps at {url}.</source>
      <translation>正在 {url} 向其他应用提供模型。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/serve_dialog.py" />
      <source>Not serving: {why}</source>
      <translation>未提供服务：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/startup_problems.py" />
      <source>Chats will not be saved: {why}</source>
      <translation>对话将不会被保存：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/startup_problems.py" />
      <source>Start a new chat history</source>
      <translation>开始新的对话记录</translation>
    </message>
    <message>
      <location filename="../../app/widgets/startup_problems.py" />
      <source>Stop the answer first, then start a new chat history.</source>
      <translation>请先停止回答，再开始新的聊天记录。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/startup_problems.py" />
      <source>Wait for the import or export to end, then start a new chat history.</source>
      <translation>请等待导入或导出结束，再开始新的聊天记录。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/startup_problems.py" />
      <source>A new chat history could not be started: {why}</source>
      <translation>无法开始新的对话记录：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/startup_problems.py" />
      <source>The chats written since Merlin started could not be copied into the new chat history ({why}); export them to keep them.</source>
      <translation>Merlin 启动后写下的对话无法复制到新的聊天记录中（{why}）；请导出它们以便保留。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/startup_problems.py" />
      <source>A new chat history was started. The old file was kept unchanged as {name}.</source>
      <translation>已开始新的对话记录。旧文件原样保留为 {name}。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/thinking_switch.py" />
      <source>Thinking</source>
      <translation>思考</translation>
    </message>
    <message>
      <location filename="../../app/widgets/version_switch.py" />
      <source>Previous version</source>
      <translation>上一个版本</translation>
    </message>
    <message>
      <location filename="../../app/widgets/version_switch.py" />
      <source>Next version</source>
      <translation>下一个版本</translation>
    </message>
    <message>
      <location filename="../../app/widgets/version_switch.py" />
      <source>Version {n} of {count}</source>
      <translation>第 {n} 个版本，共 {count} 个</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>finding the checkpoint</source>
      <translation>正在查找检查点</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>waiting for the engine</source>
      <translation>等待引擎</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>building the 2B-shaped random checkpoint (first time only)</source>
      <translation>正在构建 2B 尺寸的随机检查点（仅第一次）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>saving the converted weights for the next start</source>
      <translation>正在保存转换后的权重，供下次启动使用</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>reading the vision encoder</source>
      <translation>正在读取视觉编码器</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>compiling kernels (first start only)</source>
      <translation>正在编译计算内核（仅首次启动）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>compiling the vision kernels (first start only)</source>
      <translation>正在编译视觉内核（仅首次启动）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>ready</source>
      <translation>就绪</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Merlin demo (shapes)</source>
      <translation>Merlin 演示（形状）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Merlin demo (random weights)</source>
      <translation>Merlin 演示模型（随机权重）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Qwen3-VL-2B shapes (random weights)</source>
      <translation>Qwen3-VL-2B 尺寸（随机权重）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>reading layer {i}/{n}</source>
      <translation>正在读取第 {i}/{n} 层</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>quantizing layer {i}/{n}</source>
      <translation>正在量化第 {i}/{n} 层</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>reading embeddings</source>
      <translation>正在读取词嵌入</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>quantizing embeddings</source>
      <translation>正在量化词嵌入</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Merlin was closed while answering; the partial answer was kept.</source>
      <translation>Merlin 在回答时被关闭；已保留部分回答。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>The chat open last time could not be shown; it is in the list.</source>
      <translation>上次打开的对话无法显示；它仍在列表中。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>&amp;Chat</source>
      <translation>对话(&amp;C)</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>&amp;Model</source>
      <translation>模型(&amp;M)</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>&amp;View</source>
      <translation>视图(&amp;V)</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>&amp;Help</source>
      <translation>帮助(&amp;H)</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Attach images…</source>
      <translation>附加图片…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Quit</source>
      <translation>退出</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Load model…</source>
      <translation>加载模型…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Settings…</source>
      <translation>设置…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Performance panel</source>
      <translation>性能面板</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Demo mode (large text, big panel)</source>
      <translation>演示模式（大字体、大面板）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Full screen</source>
      <translation>全屏</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>About Merlin</source>
      <translation>关于 Merlin</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Keyboard shortcuts</source>
      <translation>键盘快捷键</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Export chat…</source>
      <translation>导出对话…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Export all chats…</source>
      <translation>导出全部对话…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Import chats…</source>
      <translation>导入对话…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Copy chat as Markdown</source>
      <translation>以 Markdown 复制对话</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Previous version of a message</source>
      <translation>消息的上一个版本</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Next version of a message</source>
      <translation>消息的下一个版本</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Serve to other apps (OpenAI API)…</source>
      <translation>提供给其他应用（OpenAI API）…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Load a model (Ctrl+L)</source>
      <translation>加载模型（Ctrl+L）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Settings (Ctrl+,)</source>
      <translation>设置（Ctrl+,）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Show or hide the performance panel (F9)</source>
      <translation>显示或隐藏性能面板（F9）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Cancel</source>
      <translation>取消</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>No model is loaded; your messages are kept and answered once one loads.</source>
      <translation>当前没有加载模型；你的消息会保留，模型加载后即会回答。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Loading the model: {phase} ({pct:.0f}%)</source>
      <translation>正在加载模型：{phase}（{pct:.0f}%）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>This is a tiny demo model trained on pictures of shapes: drop a picture of shapes and ask about them. Load a Qwen3-VL checkpoint for real answers.</source>
      <translation>这是一个用形状图片训练的小型演示模型：拖入一张形状图片并提问。加载 Qwen3-VL 检查点以获得真实回答。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Load a model…</source>
      <translation>加载模型…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>This is a demo model with random weights: its answers are random text. It shows how Merlin works and how fast it runs. Load a Qwen3-VL checkpoint for real answers.</source>
      <translation>这是一个随机权重的演示模型：它的回答是随机文本。它展示 Merlin 如何工作以及运行速度。加载 Qwen3-VL 检查点以获得真实回答。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Images cannot be used with this model: {why}</source>
      <translation>此模型无法使用图片：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>The previous model stays in use.</source>
      <translation>继续使用之前的模型。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Choose another model; your messages are kept and answered once one loads.</source>
      <translation>请选择其他模型；你的消息已保留，模型加载后会回答。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Could not load the model: {why}</source>
      <translation>无法加载模型：{why}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Choose a model…</source>
      <translation>选择模型…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Loading…</source>
      <translation>正在加载…</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>No model loaded</source>
      <translation>未加载模型</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>The experts are memory-mapped from the weight cache: the parts read from disk count in this figure, and the system can drop them again when memory is short.</source>
      <translation>专家从权重缓存内存映射：从磁盘读入的部分计入此数值，内存紧张时系统可以再释放它们。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>weights</source>
      <translation>权重</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>per token</source>
      <translation>每词元</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>experts {size} memory-mapped from the weight cache</source>
      <translation>专家 {size} 从权重缓存内存映射</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Delete chat?</source>
      <translation>删除对话？</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Delete “{title}” and its images? This cannot be undone.</source>
      <translation>删除“{title}”及其图片？此操作无法撤销。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Merlin {version}</source>
      <translation>Merlin {version}</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Merlin chats with Qwen3-VL vision-language models on this computer, with its own NumPy + Numba engine, and shows where every token's time goes.</source>
      <translation>Merlin 使用自己的 NumPy + Numba 引擎，在这台电脑上与 Qwen3-VL 视觉语言模型对话，并展示每个词元的时间花在哪里。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Send the message</source>
      <translation>发送消息</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>New line in the message</source>
      <translation>在消息中换行</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Stop the answer (keeps what it wrote)</source>
      <translation>停止回答（保留已写出的内容）</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Paste an image or text</source>
      <translation>粘贴图片或文字</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Your unsent message could not be kept on disk ({why}); it is still in the box.</source>
      <translation>未发送的消息无法保存到磁盘（{why}）；它仍在输入框中。</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Close Merlin?</source>
      <translation>关闭 Merlin？</translation>
    </message>
    <message>
      <location filename="../../app/widgets/window.py" />
      <source>Your unsent message could not be kept on disk ({why}). Close and lose it?</source>
      <translation>未发送的消息无法保存到磁盘（{why}）。仍要关闭并丢失它吗？</translation>
    </message>
  </context>
</TS>
