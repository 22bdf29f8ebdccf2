"""The part of transformers.trainer_callback the recorder uses: TrainerCallback, and DEFAULT_CALLBACKS, the
callbacks every Trainer adds (Trainer.__init__ builds its handler from DEFAULT_CALLBACKS + callbacks), as in
transformers' own trainer_callback.py. Trainer calls on_step_begin(args, state, control) at the start of every
optimizer step, before it moves the step's first batch to the device."""


class TrainerCallback:
    def on_step_begin(self, args, state, control, **kwargs):
        pass


class PrinterCallback(TrainerCallback):
    pass


DEFAULT_CALLBACKS = [PrinterCallback]
