#include "emu/fiber.h"

#include <cstdint>
#include <stdexcept>

#include "emu/sanitizers.h"

// trainer_emu_switch_context(save, load): pushes the callee-saved registers
// and the floating-point control words on the current stack, stores the
// stack pointer in *save, switches to the stack `load` and pops the same
// from it. The caller-saved registers need no saving: the C++ caller of this
// function already assumes a call clobbers them.
//
// trainer_emu_fiber_trampoline: where a fresh fiber's first switch returns
// to; calls r13(r12) (Fiber::main(self)), which never returns. Its unwind
// information marks it as the outermost frame, and rbp is 0 there, so
// debuggers and the sanitizers' frame-pointer walks stop at it.
asm(R"(
  .pushsection .text
  .globl trainer_emu_switch_context
  .hidden trainer_emu_switch_context
  .type trainer_emu_switch_context, @function
  .p2align 4
trainer_emu_switch_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size trainer_emu_switch_context, .-trainer_emu_switch_context

  .globl trainer_emu_fiber_trampoline
  .hidden trainer_emu_fiber_trampoline
  .type trainer_emu_fiber_trampoline, @function
  .p2align 4
trainer_emu_fiber_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size trainer_emu_fiber_trampoline, .-trainer_emu_fiber_trampoline
  .popsection
)");

extern "C" void trainer_emu_switch_context(void** save, void* load);
extern "C" void trainer_emu_fiber_trampoline();

// The fibers' own bookkeeping (state_, the saved stack pointers) is touched
// by a fiber and by its host thread, which TSan sees as different threads
// that never synchronise; these functions are not instrumented for it.
#define TRAINER_EMU_NO_TSAN __attribute__((no_sanitize("thread")))

namespace trainer::emu {
namespace {

// What a fiber switches back to: the host thread's own stack.
struct HostContext {
  void* sp = nullptr;
  const void* stack_bottom = nullptr;  // for ASan, learnt at the first switch
  size_t stack_size = 0;
  void* tsan_fiber = nullptr;
};

thread_local HostContext t_host;
thread_local Fiber* t_running = nullptr;

// The layout trainer_emu_switch_context pops, lowest address first.
struct InitialFrame {
  uint32_t mxcsr;
  uint16_t fpu_control;
  uint16_t unused;
  uint64_t r15, r14, r13, r12, rbx, rbp;
  uint64_t return_address;
  uint64_t top_padding[2];  // rsp lands here, 16-byte aligned, as at a function's call site
};
static_assert(sizeof(InitialFrame) == 80);

uint16_t fpu_control_word() {
  uint16_t cw;
  asm volatile("fnstcw %0" : "=m"(cw));
  return cw;
}

}  // namespace

Fiber::Fiber(size_t stack_bytes) : stack_(acquire_fiber_stack(stack_bytes)) {}

Fiber::~Fiber() {
  sanitizers::destroy_fiber(tsan_fiber_);
  release_fiber_stack(stack_);
}

TRAINER_EMU_NO_TSAN void Fiber::start(Entry entry, void* arg) {
  if (state_ == State::kRunning || state_ == State::kSuspended)
    throw std::logic_error("emu: Fiber::start on a fiber that is running or suspended midway");
  if (sanitizers::kTsan) {  // TSan forgets the previous owner's accesses with the mapping
    release_fiber_stack(stack_);
    stack_ = acquire_fiber_stack(stack_.bytes);
  }
  sanitizers::unpoison(stack_.bottom, stack_.bytes);
  entry_ = entry;
  arg_ = arg;
  char* top = static_cast<char*>(stack_.bottom) + stack_.bytes;
  auto* frame = reinterpret_cast<InitialFrame*>(top - sizeof(InitialFrame));
  *frame = InitialFrame{};
  frame->mxcsr = __builtin_ia32_stmxcsr();
  frame->fpu_control = fpu_control_word();
  frame->r13 = reinterpret_cast<uint64_t>(&Fiber::main);
  frame->r12 = reinterpret_cast<uint64_t>(this);
  frame->return_address = reinterpret_cast<uint64_t>(&trainer_emu_fiber_trampoline);
  sp_ = frame;
  sanitizers::destroy_fiber(tsan_fiber_);
  tsan_fiber_ = sanitizers::create_fiber();
  state_ = State::kStarted;
}

void Fiber::name_for_tsan(const char* name) { sanitizers::name_fiber(tsan_fiber_, name); }

TRAINER_EMU_NO_TSAN void Fiber::resume() {
  if (state_ != State::kStarted && state_ != State::kSuspended)
    throw std::logic_error("emu: Fiber::resume on a fiber that is not started, or running, or finished");
  if (t_running) throw std::logic_error("emu: Fiber::resume from inside a fiber: fibers resume only from host threads");
  t_host.tsan_fiber = sanitizers::current_fiber();
  state_ = State::kRunning;
  t_running = this;
  void* fake_stack = nullptr;
  sanitizers::start_switch(&fake_stack, stack_.bottom, stack_.bytes);
  sanitizers::switch_to_fiber(tsan_fiber_);
  trainer_emu_switch_context(&t_host.sp, sp_);
  sanitizers::finish_switch(fake_stack, nullptr, nullptr);
  t_running = nullptr;
  if (state_ == State::kFinished) {
    sanitizers::destroy_fiber(tsan_fiber_);
    tsan_fiber_ = nullptr;
  }
}

TRAINER_EMU_NO_TSAN void Fiber::main(Fiber* self) noexcept {
  sanitizers::finish_switch(nullptr, &t_host.stack_bottom, &t_host.stack_size);
  self->entry_(self->arg_);
  self->state_ = State::kFinished;
  // Null: this fiber's ASan fake stack goes, it never runs again.
  sanitizers::start_switch(nullptr, t_host.stack_bottom, t_host.stack_size);
  sanitizers::switch_to_fiber(t_host.tsan_fiber);
  trainer_emu_switch_context(&self->sp_, t_host.sp);
  __builtin_unreachable();
}

TRAINER_EMU_NO_TSAN void suspend() {
  Fiber* self = t_running;
  if (!self) throw std::logic_error("emu: suspend() called on a host thread's own stack, not on a fiber");
  self->state_ = Fiber::State::kSuspended;
  void* fake_stack = nullptr;
  sanitizers::start_switch(&fake_stack, t_host.stack_bottom, t_host.stack_size);
  sanitizers::switch_to_fiber(t_host.tsan_fiber);
  trainer_emu_switch_context(&self->sp_, t_host.sp);
  sanitizers::finish_switch(fake_stack, &t_host.stack_bottom, &t_host.stack_size);
}

TRAINER_EMU_NO_TSAN bool on_fiber() { return t_running != nullptr; }

}  // namespace trainer::emu
